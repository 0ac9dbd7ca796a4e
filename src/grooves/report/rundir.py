"""Reading a run directory back: metrics, findings, watch statistics, samples, config.

The layout is documented in `grooves.watch` (the writer and the first reader). A run that was
killed mid-write may end in a truncated line; that last line is dropped, while a bad line in
the middle of a file is an error naming the file and line, since it means something else
wrote there.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grooves.config.watch import WatchConfig
from grooves.core.trajectory import TrajectoryGroup, read_groups
from grooves.jsonl import read_jsonl
from grooves.watch.core import Watch
from grooves.watch.finding import Finding, read_findings

_STEP_FILE = re.compile(r"step_(\d+)\.(jsonl|html)$")


@dataclass
class RunData:
    """Everything the report shows about one run."""

    path: Path
    metrics: list[dict[str, Any]]
    config_text: str | None = None
    findings: list[Finding] = field(default_factory=list)
    watch_stats: list[dict[str, Any]] = field(default_factory=list)
    sample_files: dict[int, Path] = field(default_factory=dict)
    inspect_pages: dict[int, Path] = field(default_factory=dict)

    def samples(self, step: int) -> list[TrajectoryGroup]:
        return read_groups(self.sample_files[step])


def _step_files(folder: Path, suffix: str) -> dict[int, Path]:
    if not folder.is_dir():
        return {}
    found = {}
    for p in folder.iterdir():
        m = _STEP_FILE.search(p.name)
        if m and m.group(2) == suffix:
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def load_run(path: str | Path) -> RunData:
    """Read a run directory; a clear error when it is not one."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory; pass the run directory the trainer wrote")
    metrics_path = path / "metrics.jsonl"
    if not metrics_path.exists():
        raise FileNotFoundError(
            f"no metrics.jsonl in {path}: not a run directory, or the run wrote no step yet"
        )
    metrics = read_jsonl(metrics_path)
    for i, row in enumerate(metrics):
        row.setdefault("step", i)
    metrics.sort(key=lambda r: r["step"])
    config = path / "config.toml"
    watch_path = path / "watch.jsonl"
    return RunData(
        path=path,
        metrics=metrics,
        config_text=config.read_text(encoding="utf-8") if config.exists() else None,
        findings=read_findings(path / "findings.jsonl"),
        watch_stats=read_jsonl(watch_path) if watch_path.exists() else [],
        sample_files=_step_files(path / "samples", "jsonl"),
        inspect_pages=_step_files(path / "inspect", "html"),
    )


def watch_config_of(run: RunData) -> WatchConfig:
    """The run's `[watch]` table from config.toml (defaults where absent), printing off."""
    table: dict[str, Any] = {}
    if run.config_text:
        table = dict(tomllib.loads(run.config_text).get("watch", {}))
    table["echo"] = False
    return WatchConfig.model_validate(table)


def rewatch(run: RunData, config: WatchConfig | None = None) -> tuple[list[Finding], list[dict[str, Any]]]:
    """Run a fresh watch over a recorded run: its findings and per-step statistics.

    Text detectors see only the steps whose samples were kept, so their baselines count those
    steps; metric detectors see every step. Nothing is written into the run directory.
    """
    watch = Watch(config or watch_config_of(run))
    by_step = {row["step"]: row for row in run.metrics}
    stats_rows = []
    for step in sorted(set(by_step) | set(run.sample_files)):
        groups = run.samples(step) if step in run.sample_files else []
        watch.observe(step, by_step.get(step, {"step": step}), groups)
        if watch.stats:
            stats_rows.append({"step": step, **watch.stats})
    return watch.findings, stats_rows
