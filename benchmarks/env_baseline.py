"""Baseline: how often the base SmolLM2-135M-Instruct solves each environment's validation split.

The model runs behind the grooves policy server (in process, no port) and each episode goes
through `run_episode`, exactly as rollouts do in training. Per environment it prints the mean
reward, the success rate (score 1.0), how often the model gave a final answer, and the share of
its tool calls that were errors (bad JSON, unknown tool, schema violations).

CPU cost grows with `--limit x --max-turns x --max-tokens`; the defaults finish in a few
minutes on two cores. `--limit 20` runs the full validation split.

Run: .venv/bin/python benchmarks/env_baseline.py [--envs support_desk corpus_search] [--limit 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

from grooves.envs import BUILTINS, get_env, make_rollout
from grooves.models import ensure_model
from grooves.policy.transformers import TransformersPolicy
from grooves.rollouts.gather import gather
from grooves.serve.app import inprocess_client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(BUILTINS), choices=BUILTINS)
    parser.add_argument(
        "--limit", type=int, default=5, help="validation scenarios per environment (20 = all)"
    )
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0 = greedy (a deterministic baseline)"
    )
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    policy = TransformersPolicy(str(ensure_model()), served_name="smollm2-135m", max_context=8192)
    client = inprocess_client(policy)
    print(
        f"{'environment':<16}{'episodes':>9}{'mean reward':>13}{'success':>9}{'answered':>10}"
        f"{'tool errors':>13}{'seconds':>9}"
    )
    for name in args.envs:
        env = get_env(name)
        scenarios = env.scenarios("validation")[: args.limit]
        rollout = make_rollout(
            env,
            model="smollm2-135m",
            max_turns=args.max_turns,
            temperature=args.temperature,
            max_tokens=args.max_tokens,
        )
        t0 = time.perf_counter()
        groups = asyncio.run(
            gather(
                rollout,
                client,
                scenarios,
                group_size=1,
                concurrency=len(scenarios),
                max_failure_fraction=1.0,
                progress=False,
            )
        )
        trajs = [t for g in groups for t in g.trajectories]
        ok = [t for t in trajs if t.error is None]
        calls = sum(t.metrics.get("env_tool_calls", 0.0) for t in ok)
        errors = sum(t.metrics.get("env_tool_errors", 0.0) for t in ok)
        mean = sum(t.reward for t in ok) / max(1, len(ok))
        success = sum(t.reward >= 1.0 for t in ok) / max(1, len(ok))
        answered = sum(t.metrics.get("answered", 0.0) for t in ok) / max(1, len(ok))
        err_rate = f"{errors / calls:.0%} of {calls:.0f}" if calls else "no calls"
        print(
            f"{name:<16}{len(trajs):>9}{mean:>13.3f}{success:>9.0%}{answered:>10.0%}{err_rate:>13}"
            f"{time.perf_counter() - t0:>9.0f}"
        )
        for t in trajs:
            if t.error is not None:
                print(f"  failed rollout: {t.error}")


if __name__ == "__main__":
    main()
