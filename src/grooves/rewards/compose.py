"""Reward composition: several signals combined into one reward, with gates.

    reward = sum_k w_k * s_k           over the weighted signals
    reward = 0                          if any gate's score is below its threshold

A signal is anything that scores the successful trajectories of a group (`GroupSignal`): a code
check `reward(trajectory, scenario) -> float`, a learned reward model, or an LLM judge (group or
absolute). Signals are scored per group, concurrently, because judges are group-wise. Each signal's
score is written to `trajectory.rewards[name]` and the total to `trajectory.reward`, so a rising
total can always be traced to the signal that moved it.

A gate is the usual fix for a reward hack: an auxiliary check whose "no" is final, e.g. a judge
asked whether every claim in the output is supported by the input. A gated trajectory keeps its
signal scores in `rewards` and gets `metrics["reward_gated"] = 1.0`.

When a signal fails for a group (a `JudgeError` after retries and the repair attempt), the group's
trajectories are marked with `error`, so training skips them, and with `metrics["judge_failed"]`,
so a rollout that scored itself this way is not counted as a broken agent by `gather`; the failure
is counted, and the step goes on. A code reward that raises marks only its own trajectory.

`score_groups` reports what the judges cost and covered, on every step whatever happened:
judge_items (trajectories sent to a judge), judge_failures (those whose group was dropped),
judge_coverage (the scored fraction), judge_seconds (wall time until the last judge answered),
and the client's request and token counts.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from grooves.core.trajectory import Trajectory, TrajectoryGroup
from grooves.judge.endpoint import JudgeClient, TokenUsage
from grooves.judge.errors import JudgeError
from grooves.judge.score import Judge
from grooves.rewards.model import RewardModel

RewardFn = Callable[[Trajectory, dict[str, Any]], float]
"""`reward(trajectory, scenario) -> float` (may also be `async def`)."""


class SignalError(RuntimeError):
    """One trajectory's signal could not be computed (a code reward raised)."""


class GroupSignal(Protocol):
    """Scores `group.ok`, in order. Raising JudgeError drops the group."""

    async def score_group(self, group: TrajectoryGroup) -> list[float | SignalError]: ...


class CodeSignal:
    """A user reward function, called once per trajectory."""

    def __init__(self, fn: RewardFn) -> None:
        self.fn = fn

    async def score_group(self, group: TrajectoryGroup) -> list[float | SignalError]:
        out: list[float | SignalError] = []
        for traj in group.ok:
            try:
                value = self.fn(traj, group.scenario)
                if inspect.isawaitable(value):
                    value = await value
                out.append(float(value))
            except Exception as exc:  # a failing check is data about that rollout, not a crash
                out.append(SignalError(f"{type(exc).__name__}: {exc}"))
        return out


class ModelSignal:
    """A learned reward model, one batched prediction per group."""

    def __init__(self, model: RewardModel) -> None:
        self.model = model

    async def score_group(self, group: TrajectoryGroup) -> list[float | SignalError]:
        return list(await asyncio.to_thread(self.model.predict_trajectories, group.ok))


class JudgeSignal:
    """An LLM judge; its reasons are kept in `trajectory.metadata["judge"][name]`."""

    def __init__(self, judge: Judge, name: str) -> None:
        self.judge = judge
        self.name = name

    @property
    def client(self) -> JudgeClient | None:
        return getattr(self.judge, "client", None)

    async def score_group(self, group: TrajectoryGroup) -> list[float | SignalError]:
        judgment = await self.judge.judge_group(group)
        for traj, score in zip(group.ok, judgment.scores, strict=True):
            traj.metadata.setdefault("judge", {})[self.name] = {
                "reason": score.reason,
                "criteria": score.criteria,
                "rubric": f"{score.rubric}@{score.rubric_version}",
                "rubric_hash": score.rubric_hash,
            }
            if judgment.position_bias is not None:
                traj.metrics[f"{self.name}_position_bias"] = judgment.position_bias
        return [s.total for s in judgment.scores]


@dataclass
class Term:
    """One named signal in the composition."""

    name: str
    signal: GroupSignal
    weight: float = 1.0
    """Its weight in the sum; 0 for a pure gate. Weights summing to 1 keep a [0, 1] reward in [0, 1]."""
    gate: float | None = None
    """If set, a score below this threshold sets the trajectory's total reward to 0."""


def code(name: str, fn: RewardFn, weight: float = 1.0) -> Term:
    return Term(name, CodeSignal(fn), weight)


def model(name: str, reward_model: RewardModel, weight: float = 1.0) -> Term:
    return Term(name, ModelSignal(reward_model), weight)


def judge(name: str, j: Judge, weight: float = 1.0) -> Term:
    return Term(name, JudgeSignal(j, name), weight)


def gate(name: str, signal: GroupSignal | Judge | RewardFn, threshold: float = 0.5) -> Term:
    """A pure gate (weight 0) from a signal, a judge, or a code check."""
    if hasattr(signal, "score_group"):
        sig: GroupSignal = signal  # type: ignore[assignment]
    elif hasattr(signal, "judge_group"):
        sig = JudgeSignal(signal, name)  # type: ignore[arg-type]
    elif callable(signal):
        sig = CodeSignal(signal)
    else:
        raise TypeError(
            f"gate {name!r}: expected a GroupSignal, Judge or reward function, got {type(signal).__name__}"
        )
    return Term(name, sig, weight=0.0, gate=threshold)


def combine(scores: dict[str, float], terms: Sequence[Term]) -> tuple[float, list[str]]:
    """Total reward of one trajectory and the gates that closed: sum_k w_k s_k, or 0 if any gate closed.

    >>> t = [Term("a", None, 0.5), Term("b", None, 0.5), Term("g", None, 0.0, gate=0.5)]
    >>> combine({"a": 1.0, "b": 0.5, "g": 0.9}, t), combine({"a": 1.0, "b": 0.5, "g": 0.1}, t)
    ((0.75, []), (0.0, ['g']))
    """
    closed = [t.name for t in terms if t.gate is not None and scores[t.name] < t.gate]
    total = sum(t.weight * scores[t.name] for t in terms if t.weight)
    return (0.0 if closed else total), closed


@dataclass
class GroupScore:
    """Outcome of scoring one group."""

    dropped: bool = False
    error: str | None = None
    gated: int = 0
    judged: int = 0
    """Trajectories a judge was asked to score (all of `group.ok` when a term is a judge)."""
    judge_done: float | None = None
    """perf_counter() when the group's last judge answered (or failed)."""


@dataclass
class StepScores:
    """Outcome of scoring one step's groups, as metrics for the trainer's log."""

    groups: int = 0
    groups_dropped: int = 0
    trajectories_gated: int = 0
    trajectories_failed: int = 0
    signal_means: dict[str, float] = field(default_factory=dict)
    judge_usage: TokenUsage = field(default_factory=TokenUsage)
    judge_items: int = 0
    judge_failures: int = 0
    judge_seconds: float = 0.0

    @property
    def judge_coverage(self) -> float:
        """(judge_items - judge_failures) / judge_items; NaN when no judge was asked anything."""
        return (self.judge_items - self.judge_failures) / self.judge_items if self.judge_items else math.nan

    def metrics(self) -> dict[str, float]:
        out = {
            "reward_groups_dropped": float(self.groups_dropped),
            "reward_trajectories_gated": float(self.trajectories_gated),
            "reward_trajectories_failed": float(self.trajectories_failed),
        }
        out |= {f"reward_{k}_mean": v for k, v in self.signal_means.items()}
        out |= {
            "judge_items": float(self.judge_items),
            "judge_failures": float(self.judge_failures),
            "judge_coverage": self.judge_coverage,
            "judge_seconds": self.judge_seconds,
        }
        return out | self.judge_usage.metrics()


class Composite:
    """Weighted signals plus gates; scores whole groups (judges need the group)."""

    def __init__(self, terms: Sequence[Term]) -> None:
        if not terms:
            raise ValueError("a Composite needs at least one Term")
        names = [t.name for t in terms]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(
                f"signal names must be unique (they key trajectory.rewards); repeated: {', '.join(dupes)}"
            )
        self.terms = list(terms)

    def _drop(self, group: TrajectoryGroup, name: str, exc: Exception, done: float | None) -> GroupScore:
        message = f"reward signal {name!r} failed: {exc}"
        ok = group.ok
        for traj in ok:
            traj.error, traj.reward = message, 0.0
            traj.metrics["judge_failed"] = 1.0
        return GroupScore(dropped=True, error=message, judged=len(ok), judge_done=done)

    async def score_group(self, group: TrajectoryGroup) -> GroupScore:
        """Score `group.ok` with every signal, write rewards in place; see the module docstring."""
        ok = group.ok
        if not ok:
            return GroupScore()
        done: list[float] = []

        async def timed(term: Term) -> list[float | SignalError]:
            try:
                return await term.signal.score_group(group)
            finally:
                if isinstance(term.signal, JudgeSignal):
                    done.append(time.perf_counter())

        results = await asyncio.gather(*(timed(t) for t in self.terms), return_exceptions=True)
        last = max(done, default=None)
        for term, res in zip(self.terms, results, strict=True):
            if isinstance(res, JudgeError):
                return self._drop(group, term.name, res, last)
            if isinstance(res, BaseException):
                raise res
            if len(res) != len(ok):
                raise RuntimeError(
                    f"signal {term.name!r} returned {len(res)} scores for {len(ok)} trajectories"
                )
        gated = 0
        for i, traj in enumerate(ok):
            values = {t.name: res[i] for t, res in zip(self.terms, results, strict=True)}  # type: ignore[index]
            failed = [(k, v) for k, v in values.items() if isinstance(v, SignalError)]
            if failed:
                traj.error, traj.reward = f"reward signal {failed[0][0]!r} failed: {failed[0][1]}", 0.0
                continue
            scores = {k: float(v) for k, v in values.items()}  # type: ignore[arg-type]
            traj.rewards.update(scores)
            traj.reward, closed = combine(scores, self.terms)
            traj.metrics["reward_gated"] = 1.0 if closed else 0.0
            if closed:
                traj.metadata["gated_by"] = closed
                gated += 1
        return GroupScore(gated=gated, judged=len(ok) if done else 0, judge_done=last)

    async def score_groups(self, groups: Sequence[TrajectoryGroup]) -> StepScores:
        """Score one step's groups concurrently; returns the step's reward and judge-cost metrics."""
        start = time.perf_counter()
        results = await asyncio.gather(*(self.score_group(g) for g in groups))
        stats = StepScores(
            groups=len(groups),
            groups_dropped=sum(r.dropped for r in results),
            trajectories_gated=sum(r.gated for r in results),
        )
        stats.judge_items = sum(r.judged for r in results)
        stats.judge_failures = sum(r.judged for r in results if r.dropped)
        stats.judge_seconds = max(
            (r.judge_done - start for r in results if r.judge_done is not None), default=0.0
        )
        stats.trajectories_failed = sum(1 for g in groups for t in g.trajectories if t.error is not None)
        for t in self.terms:
            values = [traj.rewards[t.name] for g in groups for traj in g.ok if t.name in traj.rewards]
            if values:
                stats.signal_means[t.name] = sum(values) / len(values)
        seen: set[int] = set()
        for t in self.terms:
            client = t.signal.client if isinstance(t.signal, JudgeSignal) else None
            if client is not None and id(client) not in seen:
                seen.add(id(client))
                stats.judge_usage.add(client.take_usage())
        return stats
