"""Scoring a policy on a task's held-out scenarios: in-run validation and `grooves eval` alike.

`evaluate` is the one function both call: the first `scenarios` of a split, `samples` rollouts
each at the validation temperature, seeded from (seed, step, scenario, sample), through the same
`gather` as training. The trainer logs its metrics under `val/` every `validation.every` steps;
`grooves eval` runs it on a base model, an adapter or a checkpoint and adds 95% intervals
(`summarize`). With a run's settings and a checkpoint's step, `grooves eval` repeats that step's
validation: the same requests with the same seeds.
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable
from typing import Any

from grooves.core.trajectory import TrajectoryGroup
from grooves.report.intervals import bootstrap_interval, wilson_interval
from grooves.rollouts.gather import RolloutFn, gather
from grooves.rollouts.handle import ModelHandle
from grooves.tasks import Task
from grooves.tasks.mixture import task_metrics
from grooves.training.distributed import DataParallel
from grooves.training.step import reward_stats

GroupScorer = Callable[[list[TrajectoryGroup]], Awaitable[Any]]
"""Optional stage after rollouts: sets rewards on whole groups (judges, reward models, gates)
and returns metrics to log (a dict, or an object with `.metrics()` such as
`rewards.Composite.score_groups`'s result), e.g. judge tokens per step."""


async def evaluate(
    task: Task,
    handle: ModelHandle,
    *,
    split: str = "validation",
    scenarios: int | None,
    samples: int,
    temperature: float,
    seed: int,
    step: int = 0,
    concurrency: int = 16,
    rollout: RolloutFn | None = None,
    score: GroupScorer | None = None,
    progress: bool = False,
    prefix: str = "val/",
    dp: DataParallel | None = None,
) -> tuple[dict[str, float], list[TrajectoryGroup]]:
    """Metrics (`{prefix}reward_mean`, `{prefix}success_rate`, per task, the scorer's) and the groups.

    `handle` gives the client, model name and max tokens; sampling uses `temperature`, top_p 1 and
    request seeds from `seed` and `step`. `scenarios` None takes the whole split. `rollout` runs
    each rollout (default: the task's own, in this process); `score` is a training run's group
    scorer, so validation rewards come from the same judges and gates as training rewards.
    A failed rollout is kept in the groups and left out of the means. In a data-parallel run
    (`dp`) each rank runs its share of the rollouts and every rank gets all of them, scored once.
    """
    dp = dp or DataParallel.single()
    chosen = task.scenarios(split)
    chosen = chosen[:scenarios] if scenarios is not None else chosen
    sampler = ModelHandle(handle.client, handle.name, temperature, 1.0, handle.max_tokens, seed=seed)
    groups = await gather(
        rollout or task.rollout,
        sampler,
        chosen,
        samples,
        concurrency=concurrency,
        max_failure_fraction=1.0,
        progress=progress and dp.main,
        description=f"validation @ {step}" if split == "validation" else f"{split} @ {step}",
        seed_key=(step,),
        part=dp.share(len(chosen) * samples) if dp.active else None,
    )
    groups, scored = await score_groups(score, dp.merge_groups(groups), dp)
    scored = {f"{prefix}{k}": v for k, v in scored.items()}
    return {**reward_stats(groups, prefix=prefix), **task_metrics(groups, prefix=prefix), **scored}, groups


async def score_groups(
    score: GroupScorer | None, groups: list[TrajectoryGroup], dp: DataParallel | None = None
) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """The groups with the scorer's rewards, and its metrics; in a data-parallel run rank 0
    scores (each judge is asked once) and sends both to the other ranks."""
    if score is None:
        return groups, {}
    if dp is None or not dp.active:
        return groups, as_metrics(await score(groups))
    scored = (groups, as_metrics(await score(groups))) if dp.main else None
    return dp.broadcast(scored)


def sets_success(groups: list[TrajectoryGroup]) -> bool | None:
    """Whether any finished rollout set `metrics["success"]` (None: no rollout finished)."""
    trajs = [t for g in groups for t in g.ok]
    return any("success" in t.metrics for t in trajs) if trajs else None


def summarize(groups: list[TrajectoryGroup], *, seed: int = 0) -> dict[str, Any]:
    """The figures `grooves eval` prints: counts, success with Wilson's 95% interval (None when
    no rollout set `metrics["success"]`), reward with a 95% bootstrap interval over scenarios."""
    ok = [[t for t in g.ok] for g in groups]
    trajs = [t for g in ok for t in g]
    n = len(trajs)
    out: dict[str, Any] = {
        "scenarios": len(groups),
        "rollouts": sum(len(g) for g in groups),
        "failed": sum(len(g) - len(g.ok) for g in groups),
        "success": None,
        "reward": None,
    }
    if not n:
        return out
    if sets_success(groups):
        wins = sum(t.metrics.get("success", 0.0) for t in trajs)
        low, high = wilson_interval(wins, n)
        out["success"] = {"mean": wins / n, "low": low, "high": high, "interval": "wilson"}
    low, high = bootstrap_interval([[t.reward for t in g] for g in ok], seed=seed)
    out["reward"] = {
        "mean": statistics.fmean(t.reward for t in trajs),
        "low": low,
        "high": high,
        "interval": "bootstrap over scenarios (percentile, 10000 resamples)",
    }
    return out


def as_metrics(result: Any) -> dict[str, float]:
    """A group scorer's result as metrics: a dict, or an object with `.metrics()`."""
    if result is None:
        return {}
    return dict(result.metrics()) if hasattr(result, "metrics") else dict(result)
