"""Held-out success on `capitals` with the int8 sampler + truncated importance sampling against
the float32 sampler: the same run file, seed for seed, 20 steps each.

    python benchmarks/tis_capitals.py --seeds 0 1 2 --json docs/results/tis_capitals.json
    python benchmarks/tis_capitals.py --summarize-only ...   # runs already in runs/tis/

Each run is `grooves train examples/capitals.toml` (validation: 27 held-out countries x 4 samples
at steps 0, 10 and 20), the int8 one with `model.sampler_precision = "int8"` and
`algorithm.tis_cap = 2`. The runs go one after the other, float32 then int8 for each seed, so a
busy machine slows both alike. Reported per run: `val/success_rate` and `val/reward_mean` at the
last step, the median step time (rollout and training), the largest `mismatch_k3_mean` and the
mean fraction of tokens whose TIS weight was capped; then the mean of each arm and the paired
difference of held-out success, seed by seed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from grooves.jsonl import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
ARMS = {
    "float32": [],
    "int8+tis": ["--set", "model.sampler_precision=int8", "--set", "algorithm.tis_cap=2"],
}


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / f"{arm.split('+')[0]}-{seed}"


def train(out: Path, arm: str, seed: int) -> None:
    folder = run_dir(out, arm, seed)
    grooves = Path(sys.executable).with_name("grooves")
    cmd = [str(grooves), "train", "examples/capitals.toml", "--set", f"seed={seed}"]
    cmd += ["--set", f"output_dir={folder}", *ARMS[arm]]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def summarize(folder: Path) -> dict:
    rows = read_jsonl(folder / "metrics.jsonl")
    steps = [r for r in rows if "seconds_step" in r]
    vals = {r["step"]: r for r in rows if "val/success_rate" in r}
    last = vals[max(vals)]
    return {
        "run_dir": str(folder),
        "steps": len(steps),
        "val_success": {str(k): v["val/success_rate"] for k, v in sorted(vals.items())},
        "val_success_last": last["val/success_rate"],
        "val_reward_last": last["val/reward_mean"],
        "step_s_median": statistics.median(r["seconds_step"] for r in steps),
        "rollout_s_median": statistics.median(r["seconds_rollout"] for r in steps),
        "train_s_median": statistics.median(r["seconds_train"] for r in steps),
        "mismatch_k3_max": max(r.get("mismatch_k3_mean", 0.0) for r in steps),
        "tis_capped_fraction_mean": statistics.mean(r.get("tis_capped_fraction", 0.0) for r in steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/tis"))
    parser.add_argument("--summarize-only", action="store_true", help="read the runs already in --out")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out = args.out if args.out.is_absolute() else ROOT / args.out
    if not args.summarize_only:
        for seed in args.seeds:
            for arm in ARMS:
                train(out, arm, seed)
    runs = {arm: {str(s): summarize(run_dir(out, arm, s)) for s in args.seeds} for arm in ARMS}
    means = {
        arm: {
            key: statistics.mean(r[key] for r in per_seed.values())
            for key in (
                "val_success_last",
                "val_reward_last",
                "step_s_median",
                "rollout_s_median",
                "train_s_median",
            )
        }
        for arm, per_seed in runs.items()
    }
    diffs = [
        runs["int8+tis"][str(s)]["val_success_last"] - runs["float32"][str(s)]["val_success_last"]
        for s in args.seeds
    ]
    result = {
        "command": " ".join(["python", "benchmarks/tis_capitals.py", *sys.argv[1:]]),
        "train_command": "grooves train examples/capitals.toml --set seed=SEED --set output_dir=runs/tis/ARM-SEED"
        " (int8: --set model.sampler_precision=int8 --set algorithm.tis_cap=2)",
        "seeds": args.seeds,
        "runs": runs,
        "means": means,
        "success_diff_int8_minus_float32": diffs,
        "load_average": os.getloadavg()[0],
    }
    print(
        f"{'arm':10} {'seed':>4} {'val success':>12} {'reward':>7} {'s/step':>7} {'rollout':>8} {'train':>6} {'k3 max':>8}"
    )
    for arm, per_seed in runs.items():
        for seed, r in per_seed.items():
            print(
                f"{arm:10} {seed:>4} {r['val_success_last']:>12.3f} {r['val_reward_last']:>7.3f} {r['step_s_median']:>7.2f}"
                f" {r['rollout_s_median']:>8.2f} {r['train_s_median']:>6.2f} {r['mismatch_k3_max']:>8.4f}"
            )
    for arm, m in means.items():
        print(
            f"{arm:10} mean {m['val_success_last']:>12.3f} {m['val_reward_last']:>7.3f} {m['step_s_median']:>7.2f}"
        )
    print("held-out success, int8+tis minus float32, seed by seed:", [round(d, 3) for d in diffs])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
