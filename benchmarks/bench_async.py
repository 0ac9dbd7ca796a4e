"""What rollouts ahead of the trainer (`rollout.max_staleness`) give on this machine.

Trains the `capitals` task on SmolLM2-135M with `grooves.training` for a few steps at
max_staleness 0 (on-policy) and 1, each with and without a simulated environment: every rollout
first waits `--env-seconds` (a tool call, a sandbox, a judge over HTTP: time in which the policy
is idle), then samples its answer. Reported per setting: the median over the steps after the
first of the step's seconds (`seconds_step`), of what it waited for its rollouts
(`seconds_rollout`), and of its optimizer step (`seconds_train`).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_async.py --steps 6 --env-seconds 2

On this project's 2-core CPU the sampler and the optimizer step both use both cores, and they
take turns on the policy's lock (one set of weights); what overlaps is the environment's time.
docs/speed.md works out what the same overlap gives on a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
from pathlib import Path


class WaitingCapitals:
    """`capitals`, each rollout first waiting `seconds` as an environment would."""

    def __init__(self, seconds: float):
        from grooves.tasks.capitals import CapitalsTask

        self.inner = CapitalsTask()
        self.name = "capitals"
        self.seconds = seconds

    def scenarios(self, split):
        return self.inner.scenarios(split)

    async def rollout(self, model, scenario):
        await asyncio.sleep(self.seconds)
        return await self.inner.rollout(model, scenario)


def run(k: int, env_seconds: float, args, out: Path) -> dict:
    from grooves.config import parse_config
    from grooves.training.loop import train

    config = parse_config(
        {
            "name": f"async-k{k}-env{env_seconds:g}",
            "output_dir": str(out),
            "seed": 0,
            "steps": args.steps,
            "model": {"base_model": args.model},
            "lora": {"rank": 8, "alpha": 16},
            "rollout": {
                "group_size": 8,
                "groups_per_step": args.groups,
                "max_tokens": args.max_tokens,
                "max_staleness": k,
            },
            "optim": {"lr": 2e-4, "micro_batch_tokens": 4096},
            "validation": {"every": 0, "scenarios": 1},
            "logging": {"progress": False},
            "checkpoint": {"every": args.steps},
            "watch": {"enabled": False},
        }
    )
    run_dir = train(config, task=WaitingCapitals(env_seconds))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r][1:]  # the first step waits for everything: not steady
    med = {
        k: statistics.median(r[k] for r in steps)
        for k in ("seconds_step", "seconds_rollout", "seconds_train")
    }
    med["staleness_mean"] = statistics.fmean(r["staleness_mean"] for r in steps)
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--groups", type=int, default=2, help="groups of 8 per step")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--env-seconds", type=float, default=2.0)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-async-"))
    results = {}
    for env_seconds in (0.0, args.env_seconds):
        for k in (0, 1):
            results[(k, env_seconds)] = run(k, env_seconds, args, work / f"k{k}-env{env_seconds:g}")
    load = os.getloadavg()[0]
    print(
        f"capitals, SmolLM2-135M, {args.groups} groups x 8 x {args.max_tokens} tokens per step, "
        f"median of steps 2-{args.steps}, load average {load:.1f}"
    )
    print(
        "| environment wait per rollout | max_staleness | s/step | waiting for rollouts s | optimizer step s |"
    )
    print("|---|---:|---:|---:|---:|")
    for (k, env), r in results.items():
        print(
            f"| {env:g} s | {k} | {r['seconds_step']:.2f} | {r['seconds_rollout']:.2f} | {r['seconds_train']:.2f} |"
        )
    for env in (0.0, args.env_seconds):
        ratio = results[(0, env)]["seconds_step"] / results[(1, env)]["seconds_step"]
        print(f"environment {env:g} s: max_staleness 1 runs {ratio:.2f}x the steps/s of max_staleness 0")
    if args.json:
        Path(args.json).write_text(
            json.dumps({f"k{k}_env{e:g}": r for (k, e), r in results.items()}, indent=1)
        )


if __name__ == "__main__":
    main()
