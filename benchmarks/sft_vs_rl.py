"""SFT vs RL on the `capitals` task: held-out success and how far each moves the weights.

Two stages around the two training commands (see docs/adapters.md for the exact sequence):

    python benchmarks/sft_vs_rl.py data --out runs/capitals-gold.jsonl
    grooves sft --data runs/capitals-gold.jsonl ...           # SFT on gold answers
    grooves train examples/capitals.toml ...                  # a short RL run
    python benchmarks/sft_vs_rl.py eval --sft runs/capitals-sft [more SFT runs] --rl runs/capitals-rl

`data` writes one chat per training country, asked exactly as the task's rollout asks, answered
"The capital is <capital>." (always within the task's six-word limit, so a correct gold answer
scores 1.0). `eval` scores the base model and both final adapters on the task's held-out
countries with identical settings (greedy, and 4 samples at temperature 0.7, max 24 tokens) and
prints the weight drift of both adapters from `grooves.adapters.drift`, as markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

import torch


def write_gold(out: Path) -> int:
    from grooves.tasks.capitals import SYSTEM_PROMPT, CapitalsTask

    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for s in CapitalsTask().scenarios("train"):
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": f"What is the capital of {s['country']}?"},
                    {"role": "assistant", "content": f"The capital is {s['capital']}."},
                ]
            }
        )
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


async def _score(policy, split: str, temperature: float, samples: int, seed: int) -> dict[str, float]:
    from grooves.rollouts.gather import gather
    from grooves.rollouts.handle import ModelHandle
    from grooves.serve.app import inprocess_client
    from grooves.tasks.capitals import CapitalsTask

    task = CapitalsTask()
    client = inprocess_client(policy)
    handle = ModelHandle(client, policy.served_name, temperature, 1.0, 24, seed=seed)
    groups = await gather(
        task.rollout, handle, task.scenarios(split), samples, concurrency=64, progress=False, seed_key=(0,)
    )
    await client.close()
    trajs = [t for g in groups for t in g.ok]
    return {
        "success": statistics.fmean(t.metrics["success"] for t in trajs),
        "reward": statistics.fmean(t.reward for t in trajs),
        "words": statistics.fmean(t.metrics["words"] for t in trajs),
    }


def evaluate(adapters: dict[str, Path | None], seed: int) -> list[dict]:
    from grooves.policy.transformers import TransformersPolicy

    rows = []
    for label, adapter in adapters.items():
        policy = TransformersPolicy("smollm2-135m", adapter_path=adapter, served_name=label, seed=seed)
        greedy = asyncio.run(_score(policy, "validation", 0.0, 1, seed))
        sampled = asyncio.run(_score(policy, "validation", 0.7, 4, seed))
        train = asyncio.run(_score(policy, "train", 0.0, 1, seed))
        rows.append(
            {
                "model": label,
                "adapter": str(adapter) if adapter else "-",
                "greedy": greedy,
                "sampled": sampled,
                "train": train,
            }
        )
    return rows


def _final_adapter(run_dir: Path) -> Path:
    from grooves.adapters.registry import resolve_adapter

    return resolve_adapter(run_dir, "latest")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="stage", required=True)
    data = sub.add_parser("data", help="write the gold SFT chats")
    data.add_argument("--out", type=Path, default=Path("runs/capitals-gold.jsonl"))
    ev = sub.add_parser("eval", help="score base, SFT and RL adapters; print drift")
    ev.add_argument(
        "--sft", type=Path, nargs="+", required=True, help="SFT run folder(s) (or adapter folders)"
    )
    ev.add_argument("--rl", type=Path, required=True, help="RL run folder (or adapter folder)")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.stage == "data":
        print(f"wrote {write_gold(args.out)} chats to {args.out}")
        return

    from grooves.adapters.drift import drift_table

    torch.set_num_threads(args.threads)
    rl = _final_adapter(args.rl)
    sfts = {f"SFT {p.name}": _final_adapter(p) for p in args.sft}
    rows = evaluate({"base": None, **sfts, "RL": rl}, args.seed)
    print(
        "| model | held-out success (greedy) | held-out success (T=0.7, 4 samples) | held-out reward (greedy) | mean words (greedy) | train success (greedy) |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        g, s, t = r["greedy"], r["sampled"], r["train"]
        print(
            f"| {r['model']} | {g['success']:.3f} | {s['success']:.3f} | {g['reward']:.3f} | {g['words']:.1f} | {t['success']:.3f} |"
        )
    for label, sft in sfts.items():
        print(f"\nA = {label} ({sft}), B = RL ({rl})\n")
        print("| weights | rel A = ‖ΔW_A‖/‖W‖ | rel B = ‖ΔW_RL‖/‖W‖ | A / B | cos(ΔW_A, ΔW_RL) |")
        print("|---|---|---|---|---|")
        for r in [*drift_table([sft, rl], group="kind"), *drift_table([sft, rl], group="total")]:
            ratio = r.relative[0] / r.relative[1] if r.relative[1] else float("inf")
            print(f"| {r.name} | {r.relative[0]:.2e} | {r.relative[1]:.2e} | {ratio:.2f} | {r.cosine:+.3f} |")


if __name__ == "__main__":
    main()
