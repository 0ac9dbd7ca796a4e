"""A step's scored groups: rollouts, rewards of whole groups, and refills while too few differ.

    groups   <- `group_size` rollouts of each of the step's `groups_per_step` scenarios, started
                by the `RolloutPipeline` (up to `rollout.max_staleness` steps ahead, or now), each
                rank's share merged in a data-parallel run
    rewards  <- set by the task's rollout, then by the run's group scorer (judges, reward models,
                gates; once, on rank 0)
    refill   <- with `rollout.refill_zero_variance` (DAPO's dynamic sampling), more scenarios
                from the same seeded stream while fewer than `groups_per_step` groups' rewards
                differ, at most `max_refill_draws`

`Collector` returns them as a `Batch` with the metrics that describe the groups themselves
(rewards, signal, refills, the scorer's, seconds); `training.loop.run` trains on them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from dataclasses import dataclass
from typing import Any

from grooves.core.trajectory import TrajectoryGroup
from grooves.rollouts.gather import check_failures, gather
from grooves.tasks.mixture import task_metrics
from grooves.training.cost import HEARTBEAT_S
from grooves.training.evaluate import reward_stats, score_groups
from grooves.training.pipeline import RolloutPipeline
from grooves.training.session import Session
from grooves.training.sparse import SparseRewardWarning, groups_with_signal, refill_count


@dataclass
class Batch:
    """One step's groups, scored, and what describes them."""

    groups: list[TrajectoryGroup]
    metrics: dict[str, Any]
    """refill_draws, groups_with_signal, sparse_rewards, the reward statistics, per-task and
    scorer metrics, seconds_rollout and seconds_score."""
    data_position: int
    """The scenario stream's position after this step's scenarios (what its checkpoint records)."""


class Collector:
    """`await collect(step)`: the step's `Batch`. Rollouts in flight when the run ends are
    discarded (the pipeline is closed by the run's exit stack)."""

    def __init__(self, session: Session, closing: contextlib.AsyncExitStack):
        self.s = session
        r = session.config.rollout
        warm = session.config.model.init_adapter is not None  # set by an [sft] stage too
        self.sparse = SparseRewardWarning(r.zero_variance_warning, say=_say, warm=warm)
        # without progress bars on rank 0 (a log file), a line a minute during long rollouts
        self.heartbeat = HEARTBEAT_S if session.dp.main and not session.bars else None
        self.pipeline = RolloutPipeline(
            next_step=session.state.step + 1,
            last_step=session.config.steps,  # with stop_after, later steps may be in flight: discarded as after a kill
            max_staleness=r.max_staleness,
            per_step=r.groups_per_step,
            stream=session.stream,
            launch=self._launch,
            pins=session.pins,
            live_version=lambda: session.policy.adapters.version,
        )
        closing.push_async_callback(self.pipeline.close)

    async def __call__(self, step: int) -> Batch:
        s, r = self.s, self.s.config.rollout
        t0 = time.perf_counter()
        # rollouts: started up to max_staleness steps ago, or now; every rank's share merged
        groups = s.dp.merge_groups(await self.pipeline.take(step))
        if s.dp.active:
            check_failures(groups, r.max_failure_fraction)
        s.check_success(groups)
        t_rollout = time.perf_counter()
        # rewards of whole groups: judges, reward models, gates (once, on rank 0)
        groups, score_metrics = await score_groups(s.score, groups, s.dp)
        groups, score_metrics, draws, refill_s = await self._refill(step, groups, score_metrics)
        t_score = time.perf_counter()
        counted = [g for g in groups if len(g.ok) >= 2]
        signal = groups_with_signal(counted)
        short = max(0, r.groups_per_step - signal) if r.refill_zero_variance else None
        metrics = {
            "refill_draws": float(draws),
            "groups_with_signal": float(signal),
            "sparse_rewards": float(self.sparse.observe(step, len(counted) - signal, len(counted), short)),
            **reward_stats(groups),
            **task_metrics(groups),
            **score_metrics,
            "seconds_rollout": t_rollout - t0 + refill_s,  # refills' rollouts count as rollout time
            "seconds_score": t_score - t_rollout - refill_s,
        }
        position = self.pipeline.position(step)  # refills (max_staleness 0 only) drew after it
        return Batch(groups, metrics, s.stream.position if draws else position)

    async def _refill(
        self, step: int, groups: list[TrajectoryGroup], score_metrics: dict[str, float]
    ) -> tuple[list[TrajectoryGroup], dict[str, float], int, float]:
        """Dynamic sampling: more scenarios while too few groups have rewards that differ. Returns
        the groups, the scorer's metrics over all of them, the scenarios drawn and their rollouts' seconds."""
        s, r = self.s, self.s.config.rollout
        draws, seconds, scored = 0, 0.0, [(score_metrics, len(groups))]
        while r.refill_zero_variance and (
            more := refill_count(r.groups_per_step, groups_with_signal(groups), draws, r.max_refill_draws)
        ):
            t0 = time.perf_counter()
            extra = await gather(
                s.rollouts.rollout,
                s.handle,
                [scenario for _, scenario in s.stream.take(more)],
                r.group_size,
                concurrency=r.concurrency,
                max_failure_fraction=r.max_failure_fraction,
                progress=s.bars,
                heartbeat=self.heartbeat,
                description=f"step {step} refill",
                seed_key=(step, draws),  # (step, draws before) never equals a first draw's (step,)
            )
            seconds += time.perf_counter() - t0
            draws += more
            extra, extra_metrics = await score_groups(s.score, extra, s.dp)
            scored.append((extra_metrics, len(extra)))
            groups += extra
        return groups, merge_scored(scored) if draws else score_metrics, draws, seconds

    async def _launch(self, step: int, scenarios: list[dict], model: str | None) -> list[TrajectoryGroup]:
        """The pipeline's launch: groups of `group_size` on the step's scenarios (this rank's share),
        rewards set by the task, sampled by the live adapter or the pinned version `model`."""
        s, r = self.s, self.s.config.rollout
        return await gather(
            s.rollouts.rollout,
            s.handle if model is None else dataclasses.replace(s.handle, name=model),
            scenarios,
            r.group_size,
            concurrency=r.concurrency,
            max_failure_fraction=r.max_failure_fraction if not s.dp.active else 1.0,
            progress=s.bars,
            heartbeat=self.heartbeat,
            description=f"step {step} rollouts",
            seed_key=(step,),
            part=s.dp.share(len(scenarios) * r.group_size) if s.dp.active else None,
        )


def merge_scored(scored: list[tuple[dict[str, float], int]]) -> dict[str, float]:
    """One step's scorer metrics from its batches (the first draw, then each refill): counts and
    seconds add up; means and fractions are averaged weighted by each batch's groups."""
    if len(scored) <= 1:
        return scored[0][0] if scored else {}
    total = sum(n for _, n in scored)
    out: dict[str, float] = {}
    for key in {k for m, _ in scored for k in m}:
        values = [(m[key], n) for m, n in scored if key in m]
        if key.endswith(("_mean", "_coverage", "_fraction", "_rate")):
            out[key] = sum(v * n for v, n in values) / max(sum(n for _, n in values), 1)
        else:
            out[key] = sum(v for v, _ in values)
    return out if total else {}


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
