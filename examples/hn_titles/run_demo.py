"""The Hacker News titles demonstration, end to end: corpus, reward model, two RL runs, reports, figure.

    .venv/bin/python examples/hn_titles/run_demo.py          # what `make hn-demo` runs
    .venv/bin/python examples/hn_titles/run_demo.py --steps 10 --runs hn   # a shorter look

1. `prepare.py`: generate the corpus and train the title reward model (skipped when present).
2. Train `hn.toml` (reward model only), then `hn_gated.toml` (the same with
   `task_options.gate = "supported"`), one after the other.
3. Each run writes RUN_DIR/report.html (curves, the watch's findings, samples) and
   RUN_DIR/inspect/*.html; this script adds runs/hn_demo/summary.json and
   runs/hn_demo/hn_compare.png (both runs' curves, the first critical finding marked).

The watch runs with two extras the run file cannot express: `rescore` (the task's own reward,
to score titles against another story) and `embed` (the reward model's hashed title vectors).
The trainer builds its watch from `[watch]` alone, so the run is given `watch.enabled = false`
and this script's `Watch` as an observer, and `config.toml` is rewritten afterwards with the
`[watch]` table that actually ran. The step observer also logs `check/generator_log_points`:
the corpus generator's noise-free score of each title, the truth the reward model imitates.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: the hn_titles package

import torch  # noqa: E402

from grooves import RunConfig, TrajectoryGroup, dump_config, load_config, load_task, train, write_report  # noqa: E402
from grooves.watch import Watch, read_findings  # noqa: E402
from hn_titles import HNTitlesTask, clean_title, expected_log_points  # noqa: E402

HERE = Path(__file__).resolve().parent
RUN_FILES = {"hn": HERE / "hn.toml", "hn_gated": HERE / "hn_gated.toml"}
OUT = Path("runs/hn_demo")


def generator_check(step: int, metrics: dict[str, Any], groups: list[TrajectoryGroup]) -> dict[str, float]:
    """Step observer: the generator's noise-free log points of the step's titles, and how many differ."""
    pairs = [(g.scenario["body"], clean_title(t.completion)) for g in groups for t in g.ok]
    if not pairs:
        return {}
    titles = [title.lower() for _, title in pairs]
    return {
        "check/generator_log_points": statistics.fmean(expected_log_points(b, t) for b, t in pairs),
        "distinct_title_fraction": len(set(titles)) / len(titles),
    }


class WatchObserver:
    """A `Watch` with the task's rescore and embed functions, as a trainer step observer."""

    def __init__(self, config: RunConfig, task: HNTitlesTask) -> None:
        self.watch = Watch(config.watch, run_dir=config.output_dir, embed=task.embed, rescore=task.rescore)

    def __call__(self, step: int, metrics: dict[str, Any], groups: list[TrajectoryGroup]) -> dict[str, float]:
        self.watch.observe(step, metrics, groups)
        return dict(self.watch.stats)


def run_one(name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    config = load_config(RUN_FILES[name], overrides)
    run_dir = Path(config.output_dir)
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run: findings and samples of an old one would mix in
    task = load_task(config.task, config.task_options)
    assert isinstance(task, HNTitlesTask)
    watched = WatchObserver(config, task)
    trainer_config = config.model_copy(update={"watch": config.watch.model_copy(update={"enabled": False})})
    t0 = time.perf_counter()
    train(trainer_config, task=task, observers=[generator_check, watched])
    seconds = time.perf_counter() - t0
    (run_dir / "config.toml").write_text(dump_config(config), encoding="utf-8")
    report, line = write_report(run_dir)
    print(line, flush=True)
    return summarize(name, run_dir, seconds, report)


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    return statistics.fmean(values) if values else None


def _last_titles(run_dir: Path, k: int = 8) -> list[str]:
    files = sorted((run_dir / "samples").glob("step_*.jsonl"))
    if not files:
        return []
    groups = [
        TrajectoryGroup.model_validate_json(line)
        for line in files[-1].read_text().splitlines()
        if line.strip()
    ]
    return [clean_title(g.ok[0].completion) for g in groups if g.ok][:k]


def summarize(name: str, run_dir: Path, seconds: float, report: Path) -> dict[str, Any]:
    rows = [r for r in _rows(run_dir) if r.get("step", 0) >= 1 and "reward_mean" in r]
    val = [r for r in _rows(run_dir) if "val/reward_mean" in r]
    findings = read_findings(run_dir / "findings.jsonl") if (run_dir / "findings.jsonl").exists() else []
    first: dict[str, int] = {}
    for f in findings:
        if f.severity != "info":
            first.setdefault(f.detector, f.step)
    keys = [
        "reward_mean",
        "success_rate",
        "reward/rm_mean",
        "check/generator_log_points",
        "distinct_title_fraction",
    ]
    return {
        "run": name,
        "seconds": round(seconds, 1),
        "steps": len(rows),
        "seconds_per_step": round(statistics.fmean(r["seconds_step"] for r in rows), 1) if rows else None,
        "first_finding_step": first,
        "findings": [
            {"step": f.step, "detector": f.detector, "severity": f.severity, "message": f.message}
            for f in findings
        ],
        "first_3_steps": {k: _mean(rows[:3], k) for k in keys},
        "last_3_steps": {k: _mean(rows[-3:], k) for k in keys},
        "validation": [{k: r.get(k) for k in ("step", "val/reward_mean", "val/success_rate")} for r in val],
        "last_titles": _last_titles(run_dir),
        "report": str(report),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=list(RUN_FILES), choices=list(RUN_FILES))
    parser.add_argument("--steps", type=int, help="override the run files' steps")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import prepare  # this folder is on sys.path when the script runs

    if not (Path("runs/hn_data/reward_model") / "reward_model.json").exists():
        prepare.main([])
    overrides = {"steps": args.steps} if args.steps else {}
    OUT.mkdir(parents=True, exist_ok=True)
    summaries = [run_one(name, overrides) for name in args.runs]
    (OUT / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n", encoding="utf-8")
    from figures import compare_runs

    figure = compare_runs(
        [Path(load_config(RUN_FILES[n]).output_dir) for n in args.runs], OUT / "hn_compare.png"
    )
    for s in summaries:
        print(
            f"{s['run']}: {s['steps']} steps in {s['seconds']:.0f} s; first findings {s['first_finding_step']}; "
            f"reward {s['first_3_steps']['reward_mean']:.2f} -> {s['last_3_steps']['reward_mean']:.2f}; "
            f"honest {s['first_3_steps']['success_rate']:.2f} -> {s['last_3_steps']['success_rate']:.2f}; "
            f"report {s['report']}"
        )
    print(f"figure {figure}; summary {OUT / 'summary.json'}")


if __name__ == "__main__":
    main()
