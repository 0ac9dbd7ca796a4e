"""Held-out success of a model (base, SFT or RL adapter) on an environment's validation or test split.

Each scenario of the split (`--split`, validation by default) is played `--samples` times through the policy server and the
environment's own rollout, exactly as `grooves train` validates. Prints success (grader score
1.0) with its 95% Wilson interval, mean reward, and what the episodes did (tool calls, errors,
how they ended); `--out` merges the figures into a JSON file as
{environment: {stage: {success, reward, episodes, ci_low, ci_high, command, ...}}}.

    python benchmarks/agents_eval.py --env corpus_search --stage base
    python benchmarks/agents_eval.py --env corpus_search --stage sft --adapter runs/agents/corpus_search-sft \\
        --out docs/results/agents.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shlex
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True)
    parser.add_argument("--stage", required=True, help="name of the row: base, sft, sft+rl, ...")
    parser.add_argument(
        "--adapter", default=None, help="adapter, checkpoint or run folder (latest checkpoint)"
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument(
        "--split",
        default="validation",
        choices=["validation", "test"],
        help="validation: what runs score themselves on; test: held out from every run and choice",
    )
    parser.add_argument(
        "--scenarios", type=int, default=None, help="the first N scenarios of the split (default: all)"
    )
    parser.add_argument("--samples", type=int, default=8, help="episodes per scenario")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--max-turns", type=int, default=None, help="default: the environment's limit")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="episodes in flight at once; each holds its KV cache (64 long chats: ~10 GB)",
    )
    parser.add_argument("--out", default=None, help="JSON file to merge the figures into")
    parser.add_argument("--samples-out", default=None, help="JSONL file for every trajectory")
    args = parser.parse_args()

    import torch

    from grooves.config import resolve_init_adapter
    from grooves.models import resolve_model
    from grooves.policy.transformers import TransformersPolicy
    from grooves.report.intervals import wilson_interval
    from grooves.rollouts.gather import gather
    from grooves.rollouts.handle import ModelHandle
    from grooves.serve.app import inprocess_client
    from grooves.tasks.environment import EnvironmentTask

    if args.threads:
        torch.set_num_threads(args.threads)
    adapter = resolve_init_adapter(args.adapter) if args.adapter else None
    policy = TransformersPolicy(
        resolve_model(args.model), adapter_path=adapter, served_name="policy", seed=args.seed
    )
    client = inprocess_client(policy)
    task = EnvironmentTask(args.env, max_turns=args.max_turns)
    handle = ModelHandle(client, "policy", args.temperature, 1.0, args.max_tokens, seed=args.seed)
    scenarios = task.scenarios(args.split)[: args.scenarios]
    t0 = time.perf_counter()
    groups = asyncio.run(
        gather(
            task.rollout,
            handle,
            scenarios,
            args.samples,
            concurrency=args.concurrency,
            max_failure_fraction=1.0,
            progress=False,
            seed_key=(0,),
        )
    )
    seconds = time.perf_counter() - t0
    trajs = [t for g in groups for t in g.trajectories]
    ok = [t for t in trajs if t.error is None]
    wins = sum(t.reward >= 1.0 for t in ok)
    low, high = wilson_interval(wins, len(trajs))
    calls = sum(t.metrics.get("env_tool_calls", 0.0) for t in ok)
    errors = sum(t.metrics.get("env_tool_errors", 0.0) for t in ok)
    row = {
        "success": wins / max(len(trajs), 1),
        "reward": statistics.fmean(t.reward for t in ok) if ok else 0.0,
        "episodes": len(trajs),
        "ci_low": low,
        "ci_high": high,
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "failed_episodes": len(trajs) - len(ok),
        "tool_calls_per_episode": calls / max(len(ok), 1),
        "tool_error_fraction": errors / calls if calls else 0.0,
        "stop_reasons": dict(collections.Counter(t.metadata.get("stop_reason") for t in ok)),
        "split": args.split,
        "scenarios": len(scenarios),
        "samples": args.samples,
        "temperature": args.temperature,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "adapter": str(adapter) if adapter else None,
        "seconds": round(seconds, 1),
    }
    per_scenario = [sum(t.reward >= 1.0 for t in g.ok) for g in groups]
    print(
        f"{args.env} {args.stage} ({args.split}): success {row['success']:.3f} [{low:.3f}, {high:.3f}] over {len(trajs)} episodes, "
        f"reward {row['reward']:.3f}, {row['tool_calls_per_episode']:.1f} tool calls/episode "
        f"({row['tool_error_fraction']:.0%} errors), stops {row['stop_reasons']}, {seconds:.0f} s"
    )
    print(f"  successes per scenario (of {args.samples}): {per_scenario}")
    if args.samples_out:
        with open(args.samples_out, "w") as f:
            for t in trajs:
                f.write(
                    json.dumps(
                        {
                            "reward": t.reward,
                            "error": t.error,
                            "metadata": t.metadata,
                            "messages": t.messages[2:],
                        },
                        default=str,
                    )
                    + "\n"
                )
    if args.out:
        path = Path(args.out)
        data = json.loads(path.read_text()) if path.exists() else {}
        data.setdefault(args.env, {})[args.stage] = row
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
