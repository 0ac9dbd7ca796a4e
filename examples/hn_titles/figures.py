"""The demonstration's picture: the ungated and the gated run side by side, step by step.

Four panels from each run's metrics.jsonl: the trained reward, the share of honest titles (every
claim in the story), the reward model's score before any gate, and the share of distinct titles
in the step. The first `collapse` finding of each run is a dashed vertical line in that run's
colour.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from grooves.watch import read_findings  # noqa: E402

PANELS = [
    ("reward_mean", "trained reward (reward model, gated)"),
    ("success_rate", "honest titles (every claim in the story)"),
    ("reward/rm_mean", "reward model score (before the gate)"),
    ("distinct_title_fraction", "distinct titles in the step"),
]
COLOURS = ["#c0392b", "#1f77b4", "#2ca02c", "#9467bd"]


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [
        (r["step"], r[key]) for r in rows if r.get("step", 0) >= 1 and isinstance(r.get(key), int | float)
    ]
    return [p[0] for p in points], [p[1] for p in points]


def compare_runs(run_dirs: list[Path], out: Path) -> Path:
    """Plot the runs in `run_dirs` into one PNG at `out` (about 60 KB)."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.2), sharex=True)
    for colour, run_dir in zip(COLOURS, run_dirs, strict=False):
        rows = [
            json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()
        ]
        findings_file = run_dir / "findings.jsonl"
        findings = read_findings(findings_file) if findings_file.exists() else []
        collapse = [f for f in findings if f.detector == "collapse"]
        label = run_dir.name + (
            f" (collapse found at step {collapse[0].step})" if collapse else " (no collapse found)"
        )
        for ax, (key, title) in zip(axes.flat, PANELS, strict=True):
            x, y = _series(rows, key)
            ax.plot(x, y, color=colour, lw=1.8, label=label)
            if collapse:
                ax.axvline(collapse[0].step, color=colour, ls="--", lw=1.0)
            ax.set_title(title, fontsize=10)
            ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=8, loc="best")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
