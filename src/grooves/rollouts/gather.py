"""Rollouts in groups: many scenarios, `group_size` rollouts each, run concurrently.

`gather` is how every caller runs rollouts (training steps, validation, SFT validation, scripts): it
bounds concurrency, gives each rollout its own sampling seed, shows progress, and records a rollout
that raises as a failed trajectory (data, not a crash) until too many fail.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from grooves.core.trajectory import Trajectory, TrajectoryGroup
from grooves.rollouts.handle import ModelHandle

RolloutFn = Callable[[ModelHandle, dict[str, Any]], Awaitable[Trajectory]]
"""`async def rollout(model, scenario) -> Trajectory`: the user's agent code; `model` is the run's
`ModelHandle` (a client plus sampling settings)."""


class TooManyFailures(RuntimeError):
    """Raised when the fraction of failed rollouts in a batch passes the configured threshold."""


async def gather(
    rollout: RolloutFn,
    model: ModelHandle,
    scenarios: Sequence[dict[str, Any]],
    group_size: int,
    *,
    concurrency: int = 16,
    max_failure_fraction: float = 0.5,
    progress: bool = True,
    description: str = "rollouts",
    seed_key: tuple[int, ...] = (),
    part: range | None = None,
    heartbeat: float | None = None,
) -> list[TrajectoryGroup]:
    """Run `group_size` rollouts of each scenario, at most `concurrency` at a time.

    A rollout that raises becomes a trajectory with `error` set (the traceback's last line) and
    reward 0; it is kept for the logs and skipped by training. If more than
    `max_failure_fraction` of all rollouts fail, `TooManyFailures` is raised: a run whose agent
    code is broken should stop, not train on the survivors. A rollout whose judge failed (marked
    `metrics["judge_failed"]` by `rewards.Composite`) is skipped too, but does not count: the
    agent ran, and its judge did not answer.

    Rollout k of group g gets `model.for_rollout(*seed_key, g, k)`, so its sampling seeds depend on
    its place in the step, not on scheduling order. Any other object (an OpenAI client a script
    drives directly) is handed to every rollout as it is, without per-rollout seeds.

    `part` runs only the rollouts whose flat index g * group_size + k is in it (a data-parallel
    rank's share, `training.distributed`): every group is returned, holding just those rollouts, with
    the seeds they have in the whole step.

    `heartbeat` (seconds), without a progress bar: every that many seconds while rollouts are still
    running, one line on stdout, `DESCRIPTION: D/N rollouts done after S s`, so a log shows a long
    batch is alive.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    sem = asyncio.Semaphore(concurrency)
    groups = [TrajectoryGroup(scenario=dict(s)) for s in scenarios]
    flat = range(len(scenarios) * group_size) if part is None else part
    total = len(flat)
    bar = _progress_bar(total, description) if progress else None
    done_rewards: list[float] = []
    finished = [0]

    async def one(gi: int, k: int) -> Trajectory:
        handle = model.for_rollout(*seed_key, gi, k) if isinstance(model, ModelHandle) else model
        async with sem:
            t0 = time.perf_counter()
            try:
                traj = await rollout(handle, groups[gi].scenario)
                if not isinstance(traj, Trajectory):
                    raise TypeError(f"rollout must return a Trajectory, got {type(traj).__name__}")
            except Exception as exc:  # a bad rollout is data, not a crash
                last = traceback.format_exception_only(type(exc), exc)[-1].strip()
                traj = Trajectory(error=last, metadata={"scenario": groups[gi].scenario})
            traj.metrics.setdefault("rollout_seconds", time.perf_counter() - t0)
            finished[0] += 1
            if bar is not None:
                if traj.error is None:
                    done_rewards.append(traj.reward)
                mean = sum(done_rewards) / len(done_rewards) if done_rewards else float("nan")
                bar.set_postfix(reward=f"{mean:.3f}")
                bar.update(1)
            return traj

    tasks = [(i // group_size, asyncio.create_task(one(i // group_size, i % group_size))) for i in flat]
    beat = (
        asyncio.create_task(_heartbeat(heartbeat, description, finished, total))
        if heartbeat is not None and bar is None and total
        else None
    )
    try:
        for gi, task in tasks:
            groups[gi].trajectories.append(await task)
    finally:
        # cancelled (Ctrl-C) or failed: no rollout outlives the call, so none is still sampling
        # when its caller closes the sampler, and none ends later with an error nobody reads
        pending: list[asyncio.Task[Any]] = [task for _, task in tasks if not task.done()]
        if beat is not None:
            pending.append(beat)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if bar is not None:
            bar.close()
    check_failures(groups, max_failure_fraction)
    return groups


def check_failures(groups: Sequence[TrajectoryGroup], max_failure_fraction: float) -> None:
    """`TooManyFailures` when more than `max_failure_fraction` of the groups' rollouts failed (a
    rollout whose judge failed, `metrics["judge_failed"]`, does not count)."""
    total = sum(len(g) for g in groups)
    broken = [
        t for g in groups for t in g.trajectories if t.error is not None and not t.metrics.get("judge_failed")
    ]
    failed = len(broken)
    if total and failed / total > max_failure_fraction:
        first = broken[0].error
        raise TooManyFailures(
            f"{failed}/{total} rollouts failed (limit {max_failure_fraction:.0%}); first error: {first}"
        )


async def _heartbeat(every: float, description: str, finished: list[int], total: int) -> None:
    t0 = time.perf_counter()
    while True:
        await asyncio.sleep(every)
        print(
            f"{description}: {finished[0]}/{total} rollouts done after {time.perf_counter() - t0:.0f} s",
            flush=True,
        )


def _progress_bar(total: int, description: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, leave=False, dynamic_ncols=True)
