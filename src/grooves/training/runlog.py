"""The run folder a person reads: metrics JSONL, reward curve PNG, samples.

Layout (documented in docs/runs.md):

    config.toml            resolved config of the run
    metrics.jsonl          one JSON object per step (see `grooves.training.loop` for the keys)
    reward_curve.png       train reward (mean, with the std band) and validation success per step
    samples/step_NNNNNN.jsonl   every TrajectoryGroup of that step, one per line
    checkpoints/step_NNNNNN/    adapter, optimizer, RNG states, data position
    findings.jsonl         reward-hacking watch findings (when the watch is on)
    tensorboard/, wandb/, mlruns/, trackers.json   experiment trackers (`logging.report_to`)
    report.html            `grooves report RUN_DIR`
    .lock                  held by the trainer while it runs

A folder holds one run. A trainer locks it for as long as it runs (`lock_run_dir`), so a second
trainer on the same folder is refused instead of interleaving its steps with the first's. A new
run in a folder that already holds checkpoints is refused unless it continues them (resume) or
replaces them (overwrite, which deletes the old run's outputs first: `clear_run_outputs`), so
two runs never mix their metrics, samples and checkpoints.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grooves.core.trajectory import TrajectoryGroup, read_groups
from grooves.jsonl import read_jsonl, write_jsonl, write_models

if TYPE_CHECKING:
    from grooves.training.trackers import Trackers

LOCK_FILE = ".lock"
RUN_OUTPUTS = (
    "checkpoints",
    "samples",
    "inspect",
    "metrics.jsonl",
    "reward_curve.png",
    "findings.jsonl",
    "watch.jsonl",
    "report.html",
    "tensorboard",
    "wandb",
    "mlruns",
    "trackers.json",
)
"""What a run writes into its folder, apart from config.toml (rewritten at each start) and the lock."""


class RunFolderError(RuntimeError):
    """A run folder this run cannot use (in use, or holding another run); the message says what to do."""


@contextlib.contextmanager
def lock_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on `run_dir` for the `with` block; refuse if another process holds it.

    An `flock` on `run_dir/.lock`: the kernel drops it when the holder's process ends however it
    ends (a kill included), so a lock left by a dead trainer never blocks the next one. The file
    stays (deleting it would let a third process lock a new file while the second holds the old);
    it holds the holder's process id, for the message. flock works on local file systems; on a
    network one it may not exclude a trainer on another machine.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunFolderError(
            f"{run_dir} is in use by another trainer (process {holder}); wait for it to end or set another output_dir"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def check_run_dir(run_dir: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse a start that would mix two runs: a folder with checkpoints needs `resume` (continue
    them) or `overwrite` (replace them); `resume` needs checkpoints. Changes nothing."""
    if resume and overwrite:
        raise RunFolderError(
            "--resume continues the run in the folder and --overwrite deletes it; pass one of them"
        )
    folder = run_dir / "checkpoints"
    kept = (
        sorted(p.name for p in folder.iterdir() if not p.name.endswith(".tmp")) if folder.is_dir() else []
    )  # .tmp: never finished
    if resume and not kept:
        raise RunFolderError(f"--resume: no checkpoint in {folder}; start without --resume")
    if kept and not resume and not overwrite:
        raise RunFolderError(
            f"{run_dir} already holds a run (checkpoints up to {kept[-1]}); continue it with --resume, "
            "replace it with --overwrite, or set another output_dir"
        )


def clear_run_outputs(run_dir: Path) -> None:
    """Delete what an earlier run wrote into `run_dir` (`RUN_OUTPUTS`); other files stay."""
    for name in RUN_OUTPUTS:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


PLOT_SHARE = 0.1
"""The largest share of a run's wall time that redrawing the reward curve after its steps may take."""


class RunLog:
    """metrics.jsonl, samples/ and the reward curve; every row and samples file also goes to the
    run's experiment trackers (`trackers`), if any."""

    def __init__(self, run_dir: Path, trackers: Trackers | None = None):
        self.dir = run_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "samples").mkdir(exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.trackers = trackers
        self._plotted_at: float | None = None
        self._plot_seconds = 0.0

    def close(self) -> None:
        """Finish the trackers' runs (metrics.jsonl needs no closing)."""
        if self.trackers is not None:
            self.trackers.close()

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
        if self.trackers is not None:
            self.trackers.log(row)

    def samples(self, step: int, groups: Sequence[TrajectoryGroup], name: str = "step") -> Path:
        path = write_models(self.dir / "samples" / f"{name}_{step:06d}.jsonl", groups, append=False)
        if self.trackers is not None:
            self.trackers.samples(step, groups, name)
        return path

    def step_samples(self, step: int) -> list[TrajectoryGroup] | None:
        """The groups `samples` kept for training step `step`, or None when that step kept none."""
        path = self.dir / "samples" / f"step_{step:06d}.jsonl"
        return read_groups(path) if path.exists() else None

    def plot_if_due(self) -> None:
        """Redraw reward_curve.png unless the last redraw was too recent to be worth another: drawing
        takes matplotlib a few tenths of a second, so the curve is redrawn at most once per
        `PLOT_SHARE`-th of the time since the last one (a step of a second or less redraws it every
        few steps; a real model's step of seconds, every step). The end of a run always redraws it."""
        now = time.perf_counter()
        if self._plotted_at is not None and now - self._plotted_at < self._plot_seconds / PLOT_SHARE:
            return
        self.plot()
        self._plotted_at = time.perf_counter()
        self._plot_seconds = self._plotted_at - now

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
            ax.fill_between(
                steps,
                [m - s for m, s in zip(mean, std, strict=True)],
                [m + s for m, s in zip(mean, std, strict=True)],
                alpha=0.08,
                color="C0",
                label="train reward ± std",
            )
            ax.plot(steps, mean, color="C0", alpha=0.35, linewidth=1, label="train reward (step mean)")
            ax.plot(
                steps,
                _moving_average(mean, 5),
                color="C0",
                linewidth=2,
                label="train reward (5-step average)",
            )
        if val:
            ax.plot(
                [r["step"] for r in val],
                [r["val/success_rate"] for r in val],
                "o-",
                label="validation success rate",
                color="C1",
            )
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


def show_bars(progress: bool) -> bool:
    """Progress bars only where a person watches them: `logging.progress` on, and stderr (where the
    bars draw) a terminal. In a log file each redraw would be a line of its own."""
    return progress and sys.stderr.isatty()


def step_line(row: dict[str, Any], steps: int) -> str:
    """A step on one line, for output that is not a terminal.

    >>> step_line({"step": 3, "reward_mean": 0.5, "success_rate": 0.25, "loss": 0.012, "lr": 2e-4,
    ...            "seconds_step": 4.21, "val/success_rate": 0.5}, 20)
    'step 3/20 reward 0.500 success 0.250 loss 0.012 lr 2.0e-04 4.2 s val/success 0.500'
    """
    parts = [f"step {row['step']}/{steps}"]
    for key, label, spec in (
        ("reward_mean", "reward", ".3f"),
        ("success_rate", "success", ".3f"),
        ("loss", "loss", ".3g"),
        ("lr", "lr", ".1e"),
    ):
        value = row.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            parts.append(f"{label} {value:{spec}}")
    if isinstance(row.get("seconds_step"), int | float):
        parts.append(f"{row['seconds_step']:.1f} s")
    if isinstance(row.get("val/success_rate"), int | float) and math.isfinite(row["val/success_rate"]):
        parts.append(f"val/success {row['val/success_rate']:.3f}")
    return " ".join(parts)


def _moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to `window` values (shorter at the start)."""
    out = []
    for i in range(len(values)):
        part = values[max(0, i - window + 1) : i + 1]
        out.append(sum(part) / len(part))
    return out


class StepProgress:
    """A run's steps where a person watches them (RL and SFT alike): one progress bar on a
    terminal (`show_bars`), else one line per step (`step_line`);
    nothing where `show` is false (the other ranks of a data-parallel run)."""

    def __init__(self, progress: bool, name: str, steps: int, done: int, *, show: bool = True):
        from tqdm.auto import tqdm

        self.bars = show and show_bars(progress)
        self.lines = show and not self.bars  # a log file, or progress = false: one line per step, always
        self.steps = steps
        self.bar = tqdm(total=steps, initial=done, desc=name, disable=not self.bars, dynamic_ncols=True)

    def step(self, metrics: dict[str, Any], **postfix: str) -> None:
        """One step done: the bar moves on with `postfix` beside it, or its line is printed."""
        self.bar.update(1)
        self.bar.set_postfix(**postfix)
        if self.lines:
            print(step_line(metrics, self.steps), flush=True)

    def close(self) -> None:
        self.bar.close()
