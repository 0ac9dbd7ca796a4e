"""Summarise runs of `grooves train examples/verifiers/*.toml` as the JSON docs/environments.md quotes.

For each run folder: held-out success before the first step and after the last (episodes,
successes, rate and Wilson's 95% interval, from the validation samples), the held-out mean
reward, the training reward of each step, and the largest gap between the logprobs that came back
in verifiers' traces and the trainer's recomputed ones. `--time` names the `/usr/bin/time -v`
output of a run (its wall time and peak RSS are read from it).

    python benchmarks/verifiers_results.py runs/verifiers/capital_quiz runs/verifiers/capital_chain \
        --time runs/verifiers/quiz.err runs/verifiers/chain.err --json docs/results/verifiers_capitals.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from grooves.report.intervals import wilson_interval


def _validation(path: Path) -> dict:
    """Success and reward over every sampled episode of one validation file."""
    rewards, successes = [], []
    for line in path.read_text().splitlines():
        for traj in json.loads(line)["trajectories"]:
            rewards.append(float(traj["reward"]))
            successes.append(float(traj["metrics"].get("success", 0.0)))
    n, won = len(successes), int(sum(successes))
    low, high = wilson_interval(won, n)
    return {
        "episodes": n,
        "successes": won,
        "success_rate": won / n,
        "success_95": [round(low, 4), round(high, 4)],
        "reward_mean": sum(rewards) / n,
    }


def _timing(path: Path) -> dict:
    """Wall time (s) and peak RSS (kB) from `/usr/bin/time -v`'s report."""
    text = path.read_text()
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text).group(1)
    seconds = 0.0
    for part in wall.split(":"):
        seconds = seconds * 60 + float(part)
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1))
    return {"wall_s": round(seconds, 1), "peak_rss_kb": rss}


def summarise(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    files = sorted((run / "samples").glob("validation_*.jsonl"))
    return {
        "command": f"/usr/bin/time -v grooves train examples/verifiers/{run.name}.toml",
        "run": str(run),
        "config": (run / "config.toml").read_text(),
        "before": _validation(files[0]) | {"step": int(files[0].stem.split("_")[1])},
        "after": _validation(files[-1]) | {"step": int(files[-1].stem.split("_")[1])},
        "train_reward_mean": [r["reward_mean"] for r in steps],
        "mismatch_abs_max": max((r.get("mismatch_abs_max", 0.0) for r in steps), default=None),
        "prefix_breaks": sum(r.get("prefix_breaks", 0.0) for r in steps),
        "failed_rollouts": sum(r.get("failed_rollouts", 0.0) for r in steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--time", nargs="*", type=Path, default=[], help="each run's /usr/bin/time -v output")
    parser.add_argument("--json", type=Path, help="write the summary here")
    args = parser.parse_args()
    out = []
    for i, run in enumerate(args.runs):
        entry = summarise(run)
        if i < len(args.time):
            entry |= _timing(args.time[i])
        out.append(entry)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
