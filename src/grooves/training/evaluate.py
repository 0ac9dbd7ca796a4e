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
from typing import Any, cast

from grooves.core.trajectory import Trajectory, TrajectoryGroup
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
    heartbeat: float | None = None,
) -> tuple[dict[str, float], list[TrajectoryGroup]]:
    """Metrics (`{prefix}reward_mean`, `{prefix}success_rate`, per task, the scorer's) and the groups.

    `handle` gives the client, model name and max tokens; sampling uses `temperature`, top_p 1 and
    request seeds from `seed` and `step`. `scenarios` None takes the whole split. `rollout` runs
    each rollout (default: the task's own, in this process); `score` is a training run's group
    scorer, so validation rewards come from the same judges and gates as training rewards.
    A failed rollout is kept in the groups and left out of the means. In a data-parallel run
    (`dp`) each rank runs its share of the rollouts and every rank gets all of them, scored once.
    `heartbeat`: seconds between lines saying how far the rollouts are, when no bar shows it.
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
        heartbeat=heartbeat if dp.main else None,
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
    # rank 0's pair, which every rank receives (the others pass None)
    return cast(tuple[list[TrajectoryGroup], dict[str, float]], dp.broadcast(scored))


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
    out["reward_parts"] = reward_parts(trajs)
    out.update(tool_use(trajs))
    return out


def reward_parts(trajs: list[Trajectory]) -> dict[str, float]:
    """The mean of each reward part (`traj.rewards`: a grader's parts, each judge's score) over the
    rollouts; a rollout without a part counts 0 for it."""
    names = sorted({name for t in trajs for name in t.rewards})
    return {name: statistics.fmean(t.rewards.get(name, 0.0) for t in trajs) for name in names}


def tool_use(trajs: list[Trajectory]) -> dict[str, Any]:
    """Tool calls the rollouts made (read from their chats) and how many of them failed (the
    environment's count, `env_tool_errors`, or an MCP environment's `tool_errors`; None when the
    task counts none)."""
    calls = [
        sum(len(m.get("tool_calls") or []) for m in t.messages if m.get("role") == "assistant") for t in trajs
    ]
    counted = [t.metrics.get("env_tool_errors", t.metrics.get("tool_errors")) for t in trajs]
    errors = int(sum(c for c in counted if c is not None)) if any(c is not None for c in counted) else None
    total = sum(calls)
    return {
        "tool_calls": {"total": total, "per_rollout": total / len(trajs) if trajs else 0.0},
        "tool_errors": None
        if errors is None
        else {"total": errors, "fraction_of_calls": errors / total if total else 0.0},
    }


def episode_record(traj: Trajectory, scenario: dict[str, Any], index: int, sample: int) -> dict[str, Any]:
    """One rollout as `grooves eval --samples-out` writes it: the scenario it ran (id, index in the
    chosen scenarios, sample number), the chat, each tool call by name and arguments, the reward and
    its parts, success, metrics and metadata (a grader's notes, the stop reason), or the error."""
    calls = [
        {
            "name": (call.get("function") or {}).get("name"),
            "arguments": (call.get("function") or {}).get("arguments"),
        }
        for m in traj.messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
        if isinstance(call, dict)
    ]
    return {
        "scenario_id": scenario.get("id"),
        "scenario_index": index,
        "sample": sample,
        "reward": traj.reward,
        "rewards": traj.rewards,
        "success": traj.metrics.get("success"),
        "error": traj.error,
        "tool_calls": calls,
        "messages": traj.messages,
        "metrics": traj.metrics,
        "metadata": traj.metadata,
    }


def as_metrics(result: Any) -> dict[str, float]:
    """A group scorer's result as metrics: a dict, or an object with `.metrics()`."""
    if result is None:
        return {}
    return dict(result.metrics()) if hasattr(result, "metrics") else dict(result)
