"""False-positive rate of the watch on healthy synthetic runs, and its delay on hacked ones.

Healthy: seeded runs of four shapes (noisy improvement, random walk, flat, binary success),
random reward scale, titles grounded in their stories, a held-out check loosely coupled to the
trained quality. A run counts as a false positive for a detector if that detector raised any
warning or critical finding anywhere in it. Hacked: the same generator with one hack switched
on at `--hack-step`; "detected" means the expected detector fired at or after that step, and
"early" counts runs where any detector fired a warning or worse before it.

    .venv/bin/python benchmarks/bench_watch_fpr.py              # 200 healthy, 40 per hack
    .venv/bin/python benchmarks/bench_watch_fpr.py --healthy 100 --steps 300 --hacked 0
    .venv/bin/python benchmarks/bench_watch_fpr.py --min-t 2.0       # the divergence test's trade-off
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

from synthetic_runs import EXPECTED_DETECTOR, HACKS, RunShape, synthetic_run

from grooves.watch import Watch, WatchConfig

DETECTORS = ["reward_jump", "collapse", "input_independence", "length_drift", "check_divergence"]


def watch_run(seed: int, shape: RunShape, config: WatchConfig) -> Watch:
    watch = Watch(config)
    for s in synthetic_run(seed, shape):
        watch.observe(s.step, s.metrics, s.groups)
    return watch


def healthy_table(runs: int, steps: int, config: WatchConfig) -> None:
    per_detector: Counter[str] = Counter()
    any_finding = 0
    families: Counter[str] = Counter()
    for seed in range(runs):
        watch = watch_run(seed, RunShape(steps=steps), config)
        fired = {f.detector for f in watch.findings if f.severity != "info"}
        per_detector.update(fired)
        any_finding += bool(fired)
        families.update(f.detector for f in watch.findings if f.severity == "info")
    print(f"\nHealthy runs: {runs} runs x {steps} steps (8 inputs x 4 samples per step)")
    print(f"{'detector':<22}{'runs with a finding':>22}{'false-positive rate':>22}")
    for name in DETECTORS:
        print(f"{name:<22}{per_detector[name]:>22}{per_detector[name] / runs:>22.1%}")
    print(f"{'any detector':<22}{any_finding:>22}{any_finding / runs:>22.1%}")
    if families:
        print(f"info notices (not counted): {dict(families)}")


def hacked_table(runs: int, steps: int, hack_step: int, config: WatchConfig) -> None:
    print(f"\nHacked runs: {runs} runs per hack, {steps} steps, hack from step {hack_step}")
    print(
        f"{'hack':<14}{'expected detector':<22}{'detected':>10}{'median delay':>14}{'max delay':>11}{'early':>7}"
    )
    for hack in HACKS:
        delays, early = [], 0
        for seed in range(runs):
            shape = RunShape(steps=steps, hack=hack, hack_step=hack_step)
            watch = watch_run(10_000 + seed, shape, config)
            hits = [
                f.step
                for f in watch.findings
                if f.detector == EXPECTED_DETECTOR[hack] and f.step >= hack_step
            ]
            early += any(f.step < hack_step and f.severity != "info" for f in watch.findings)
            if hits:
                delays.append(hits[0] - hack_step)
        median = f"{statistics.median(delays):.0f} steps" if delays else "-"
        worst = f"{max(delays)}" if delays else "-"
        print(
            f"{hack:<14}{EXPECTED_DETECTOR[hack]:<22}{len(delays) / runs:>10.0%}{median:>14}{worst:>11}{early:>7}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--healthy", type=int, default=200, help="healthy runs")
    parser.add_argument("--hacked", type=int, default=40, help="runs per hack")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--hack-step", type=int, default=50)
    parser.add_argument("--min-t", type=float, default=None, help="override check_divergence.min_t")
    args = parser.parse_args()
    config = WatchConfig(echo=False)
    if args.min_t is not None:
        config.check_divergence.min_t = args.min_t
        print(f"check_divergence.min_t = {args.min_t}")
    t0 = time.perf_counter()
    if args.healthy:
        healthy_table(args.healthy, args.steps, config)
    if args.hacked:
        hacked_table(args.hacked, args.steps, args.hack_step, config)
    print(f"\n{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
