"""The `Watch`: runs every detector on every step, keeps the findings, writes them down.

It is an observer: it reads the step's metrics and groups and returns findings; it holds no
reference to the optimizer or the policy, and `should_pause` is advice the trainer may take.
The trainer calls, once per step::

    findings = watch.observe(step, metrics, groups)   # groups may be () on steps without samples
    metrics.update(watch.stats)                        # optional: log watch/... next to the rest
    if watch.should_pause: ...                         # the trainer decides

With a run directory, the watch appends to `findings.jsonl` and `watch.jsonl` (its per-step
statistics) and writes `inspect/step_XXXXXX.html` every `inspect.every` steps.

A resumed run calls `watch.resume(step, history)` first: the detectors' baselines and the
cooldowns are rebuilt by replaying the logged steps up to the checkpoint, so a run killed at
step 40 judges step 41 against the same history as one that never stopped, and the two files
lose their lines for the steps after the checkpoint (those steps run again).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from grooves.config.watch import WatchConfig
from grooves.core.trajectory import TrajectoryGroup
from grooves.jsonl import read_jsonl, write_jsonl, write_models
from grooves.watch.finding import Finding, at_least, read_findings, write_findings
from grooves.watch.interfaces import Detector, EmbedFn, RescoreFn
from grooves.watch.metric_detectors import CheckDivergence, LengthDrift, RewardJump
from grooves.watch.pages import inspection_page, pick_samples
from grooves.watch.text_detectors import Collapse, InputIndependence
from grooves.watch.view import StepView


def default_detectors(
    config: WatchConfig, embed: EmbedFn | None = None, rescore: RescoreFn | None = None
) -> list[Detector]:
    """The built-in detectors that `config` enables, in report order."""
    built: list[Detector] = []
    if config.reward_jump.enabled:
        built.append(RewardJump(config.reward_jump))
    if config.collapse.enabled:
        built.append(Collapse(config.collapse, embed=embed, seed=config.seed))
    if config.input_independence.enabled:
        built.append(InputIndependence(config.input_independence, rescore=rescore, seed=config.seed))
    if config.length_drift.enabled:
        built.append(LengthDrift(config.length_drift))
    if config.check_divergence.enabled:
        built.append(CheckDivergence(config.check_divergence))
    return built


class Watch:
    """Reward-hacking detectors over a run, step by step."""

    def __init__(
        self,
        config: WatchConfig | None = None,
        *,
        run_dir: str | Path | None = None,
        embed: EmbedFn | None = None,
        rescore: RescoreFn | None = None,
        extra_detectors: Sequence[Detector] = (),
    ) -> None:
        self.config = config or WatchConfig()
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.detectors: list[Detector] = default_detectors(self.config, embed, rescore) + list(
            extra_detectors
        )
        self.findings: list[Finding] = []
        """Every finding raised so far (after the cooldown)."""
        self.stats: dict[str, float] = {}
        """The last step's statistics, `watch/<detector>/<quantity>`."""
        self.last_inspection: Path | None = None
        self._last_fired: dict[str, int] = {}
        self._inspected_at = -1
        self._pause = False

    def observe(
        self, step: int, metrics: Mapping[str, Any], groups: Sequence[TrajectoryGroup] = ()
    ) -> list[Finding]:
        """Run every detector on one step; return the new findings (repeats within the cooldown dropped)."""
        view = StepView.build(step, metrics, groups, self.config.input_keys)
        stats: dict[str, float] = {}
        raised: list[Finding] = []
        for detector in self.detectors:
            observation = detector.observe(view)
            stats.update(observation.stats)
            raised.extend(observation.findings)
        new = [f for f in raised if self._admit(f)]
        self.stats = stats
        self.findings.extend(new)
        if self.config.pause_on != "never" and any(at_least(f.severity, self.config.pause_on) for f in new):
            self._pause = True
        self._record(step, stats, new)
        if self._inspection_due(step, view):
            self.last_inspection = self._inspect(step, view, stats)
            self._inspected_at = step
        if self.config.echo:
            for finding in new:
                print(finding, file=sys.stderr)
        return new

    def resume(
        self, step: int, history: Iterable[tuple[int, Mapping[str, Any], Sequence[TrajectoryGroup]]]
    ) -> int:
        """Pick a run up after its checkpoint at `step`; returns how many steps were replayed.

        `history` is (step, metrics, groups) for the steps already trained, as `observe` saw them
        (the trainer reads them back from metrics.jsonl and samples/). Every detector observes
        them again in order, which rebuilds its state exactly, since detectors are deterministic
        in their inputs; the findings they raise again refill `findings` and the cooldowns, and
        nothing is written, printed or inspected, and no pause is set (the person resuming has
        read them). An embedding or rescoring function is called again for the replayed steps.
        """
        if self.run_dir is not None:
            self._truncate_files_after(step)
        replayed = 0
        for s, metrics, groups in history:
            if s > step:
                break
            view = StepView.build(s, metrics, groups, self.config.input_keys)
            raised = [f for detector in self.detectors for f in detector.observe(view).findings]
            self.findings.extend(f for f in raised if self._admit(f))
            self._inspected_at = s if self._inspection_due(s, view) else self._inspected_at
            replayed += 1
        return replayed

    def _truncate_files_after(self, step: int) -> None:
        assert self.run_dir is not None  # called where there is one
        findings_path, stats_path = self.run_dir / "findings.jsonl", self.run_dir / "watch.jsonl"
        if findings_path.exists():
            write_models(
                findings_path, [f for f in read_findings(findings_path) if f.step <= step], append=False
            )
        if stats_path.exists():
            write_jsonl(stats_path, [r for r in read_jsonl(stats_path) if r.get("step", 0) <= step])

    @property
    def should_pause(self) -> bool:
        """True once a finding at or above `pause_on` has been raised (until `clear_pause`)."""
        return self._pause

    def clear_pause(self) -> None:
        """Acknowledge the findings so far: `should_pause` is false until the next severe one."""
        self._pause = False

    def _admit(self, finding: Finding) -> bool:
        if finding.severity == "info":
            key = "info:" + finding.stream  # a notice (a blind test, a failing rescorer) is said once
            if key in self._last_fired:
                return False
            self._last_fired[key] = finding.step
            return True
        last = self._last_fired.get(finding.stream)
        if last is not None and finding.step - last < self.config.cooldown_steps:
            return False
        self._last_fired[finding.stream] = finding.step
        return True

    def _record(self, step: int, stats: dict[str, float], new: list[Finding]) -> None:
        if self.run_dir is None:
            return
        if new:
            write_findings(self.run_dir / "findings.jsonl", new)
        if stats:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with (self.run_dir / "watch.jsonl").open("a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, **stats}) + "\n")

    def _inspection_due(self, step: int, view: StepView) -> bool:
        every = self.config.inspect.every
        return self.run_dir is not None and every > 0 and step % every == 0 and bool(view.groups)

    def _inspect(self, step: int, view: StepView, stats: dict[str, float]) -> Path:
        assert self.run_dir is not None  # `_inspection_due` holds only with one
        c = self.config.inspect
        samples = pick_samples(
            view.groups,
            n_best=c.n_best,
            n_worst=c.n_worst,
            n_random=c.n_random,
            rng=np.random.default_rng([self.config.seed, step, 2]),
            input_keys=self.config.input_keys,
        )
        path = self.run_dir / "inspect" / f"step_{step:06d}.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        since = [f for f in self.findings if self._inspected_at < f.step <= step]
        path.write_text(inspection_page(step, samples, since, c.max_chars, stats), encoding="utf-8")
        return path
