"""What a training run leaves behind after each step, and what watches it.

`Recorder` is called once per step with the step's metrics and groups. It runs the step's
observers (the reward-hacking watch and the caller's), then on rank 0 writes the run folder:
the metrics row (and the experiment trackers `logging.report_to` names), the step's samples
(`logging.samples_every`), a checkpoint when `[checkpoint]` says one is due, the reward curve
(when its redraw is due: `RunLog.plot_if_due`), and the progress bar or step line. It answers
whether the watch paused the run. Validation metrics and samples go through it too, and `finish`
draws the curve and writes the report (`logging.report`).

Observers may add metrics; they never change training.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from grooves.core.trajectory import TrajectoryGroup
from grooves.report.write import write_report
from grooves.training.checkpoint import TrainState, save_if_due
from grooves.training.runlog import RunLog, StepProgress
from grooves.training.session import Session
from grooves.training.trackers import start_trackers
from grooves.watch import Watch

StepObserver = Callable[[int, dict[str, Any], list[TrajectoryGroup]], dict[str, Any] | None]
"""Watches a step (e.g. the reward-hacking watch). May add metrics; never changes training."""


class Recorder:
    """The run folder (rank 0), the step's observers, the progress display, the watch's pause."""

    def __init__(
        self,
        session: Session,
        closing: contextlib.ExitStack | contextlib.AsyncExitStack,
        *,
        observers: Sequence[StepObserver] = (),
        watch: Watch | None = None,
    ):
        self.s = session
        s, config = session, session.config
        resumed_at = s.state.step if s.resumed else None
        self.log: RunLog | None = None
        if s.dp.main:  # metrics.jsonl and samples/, and the trackers `logging.report_to` names
            trackers = start_trackers(
                config.logging, config.name, s.run_dir, s.config_toml, resumed_at=s.state.step
            )
            self.log = RunLog(s.run_dir, trackers=trackers)
            closing.callback(self.log.close)
            self.log.truncate_after(s.state.step if s.resumed else -1)  # on resume: no step appears twice
            (s.run_dir / "config.toml").write_text(s.config_toml)
        self.watch = _start_watch(config, self.log, watch, resumed_at) if self.log is not None else None
        self.observers = [*observers, self.watch.observe_step] if self.watch is not None else list(observers)
        self.progress = StepProgress(
            config.logging.progress, config.name, config.steps, s.state.step, show=s.dp.main
        )
        closing.callback(self.progress.close)

    def validation(
        self, step: int, metrics: dict[str, float], groups: list[TrajectoryGroup]
    ) -> dict[str, float]:
        """A validation's samples (and, before the first step, its metrics row); returns its metrics."""
        if self.log is not None:
            if step == 0:
                self.log.log({"step": 0, **metrics})
            self.log.samples(step, groups, name="validation")
        return metrics

    def __call__(
        self,
        step: int,
        metrics: dict[str, Any],
        groups: list[TrajectoryGroup],
        *,
        started: float,
        data_position: int,
    ) -> bool:
        """Record step `step` (begun at `started`, a `perf_counter` time); True when the watch
        paused the run (its checkpoint is written first), on every rank alike."""
        s, config = self.s, self.s.config
        for observe in self.observers:  # after validation: the watch compares val/ metrics with the reward
            metrics.update(observe(step, metrics, groups) or {})
        metrics["seconds_step"] = time.perf_counter() - started
        s.state = TrainState(step=step, data_position=data_position)
        pause = self.watch is not None and self.watch.should_pause
        if self.log is not None:
            self.log.log(metrics)
            if step % config.logging.samples_every == 0:
                self.log.samples(step, groups)
            extra = s.pins.checkpoint_versions(step, config.steps) if s.pins is not None else None
            save_if_due(
                s.run_dir,
                s.state,
                s.policy,
                s.optimizer,
                s.config_toml,
                config.checkpoint,
                last=config.steps,
                force=pause,
                extra=extra,
            )
            self.log.plot_if_due()
            self.progress.step(
                metrics, reward=f"{metrics['reward_mean']:.3f}", step_s=f"{metrics['seconds_step']:.1f}"
            )
        if not s.dp.broadcast(pause):
            return False
        if s.dp.main:
            print(
                f"paused by the reward-hacking watch at step {step}; read {s.run_dir}/findings.jsonl, then --resume",
                flush=True,
            )
        return True

    def finish(self) -> None:
        """The run ended (its last step, or a pause): the progress display closes, the report is written."""
        self.progress.close()
        if self.log is not None:
            self.log.plot()
            if self.s.config.logging.report:
                write_report(self.s.run_dir)


class _WatchObserver:
    def __init__(self, watch: Watch):
        self.watch = watch

    @property
    def should_pause(self) -> bool:
        return self.watch.should_pause

    def observe_step(
        self, step: int, metrics: dict[str, Any], groups: list[TrajectoryGroup]
    ) -> dict[str, Any]:
        self.watch.observe(step, metrics, groups)
        return dict(self.watch.stats)


def _start_watch(config, log: RunLog, given: Watch | None, resumed_at: int | None) -> _WatchObserver | None:
    """The run's watch (`given`, else the one `config.watch` describes, if enabled); on a resumed
    run the detectors first judge the steps so far again, to rebuild their history."""
    if given is not None:
        given.run_dir = given.run_dir or log.dir
        watch = given
    elif config.watch.enabled:
        watch = Watch(config.watch, run_dir=log.dir)
    else:
        return None
    if resumed_at is not None:  # the detectors judge the next step against the whole run so far
        watch.resume(resumed_at, _watch_history(log, resumed_at))
    return _WatchObserver(watch)


def _watch_history(log: RunLog, upto: int) -> Iterator[tuple[int, dict[str, Any], list[TrajectoryGroup]]]:
    """Steps 1..`upto` as the watch observed them: each logged row without what the step added after
    its observers ran (the watch's own statistics, the step's total seconds), and the step's groups
    where samples/ has them (`logging.samples_every`; else the text detectors skip that step)."""
    for row in sorted(log.rows(), key=lambda r: r["step"]):
        step = row["step"]
        if not 1 <= step <= upto or "reward_mean" not in row:
            continue
        metrics = {k: v for k, v in row.items() if not k.startswith("watch/") and k != "seconds_step"}
        yield step, metrics, log.step_samples(step) or []
