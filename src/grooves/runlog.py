"""The run folder a person reads: metrics JSONL, reward curve PNG, samples.

Layout (documented in the README):

    config.toml            resolved config of the run
    metrics.jsonl          one JSON object per step (see `grooves.trainer` for the keys)
    reward_curve.png       train reward (mean, with the std band) and validation success per step
    samples/step_NNNNNN.jsonl   every TrajectoryGroup of that step, one per line
    checkpoints/step_NNNNNN/    adapter, optimizer, RNG states, data position
    findings.jsonl         reward-hacking watch findings (when the watch is on)
    report.html            `grooves report RUN_DIR`
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grooves.jsonl import read_jsonl, write_jsonl, write_models
from grooves.trajectory import TrajectoryGroup


class RunLog:
    def __init__(self, run_dir: Path):
        self.dir = run_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "samples").mkdir(exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"

    def truncate_after(self, step: int) -> None:
        """On resume: drop metric rows of steps after the checkpoint, so no step appears twice."""
        write_jsonl(self.metrics_path, [r for r in self.rows() if r.get("step", 0) <= step])

    def rows(self) -> list[dict[str, Any]]:
        """The logged rows; a line cut short by a killed run is dropped (its step is not checkpointed)."""
        return read_jsonl(self.metrics_path) if self.metrics_path.exists() else []

    def log(self, row: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(clean) + "\n")

    def samples(self, step: int, groups: Sequence[TrajectoryGroup], name: str = "step") -> Path:
        return write_models(self.dir / "samples" / f"{name}_{step:06d}.jsonl", groups, append=False)

    def plot(self) -> Path:
        """Redraw reward_curve.png from metrics.jsonl."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.rows()
        train = [r for r in rows if r.get("reward_mean") is not None]
        val = [r for r in rows if r.get("val/success_rate") is not None]
        fig, ax = plt.subplots(figsize=(7, 4))
        if train:
            steps = [r["step"] for r in train]
            mean = [r["reward_mean"] for r in train]
            std = [r.get("reward_std") or 0.0 for r in train]
            ax.fill_between(steps, [m - s for m, s in zip(mean, std, strict=True)], [m + s for m, s in zip(mean, std, strict=True)], alpha=0.08, color="C0", label="train reward ± std")
            ax.plot(steps, mean, color="C0", alpha=0.35, linewidth=1, label="train reward (step mean)")
            ax.plot(steps, _moving_average(mean, 5), color="C0", linewidth=2, label="train reward (5-step average)")
        if val:
            ax.plot([r["step"] for r in val], [r["val/success_rate"] for r in val], "o-", label="validation success rate", color="C1")
        ax.set_xlabel("step")
        ax.set_ylabel("reward / success")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
        ax.set_title(self.dir.name)
        fig.tight_layout()
        path = self.dir / "reward_curve.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to `window` values (shorter at the start)."""
    out = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1) : i + 1]
        out.append(sum(part) / len(part))
    return out
