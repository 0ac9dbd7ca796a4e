"""`gather`: rollouts as groups, and no rollout outliving the call."""

from __future__ import annotations

import asyncio
import re

import pytest

from grooves import Trajectory, gather


def test_a_cancelled_gather_leaves_no_rollout_running():
    """Ctrl-C cancels the step while rollouts wait on the sampler: each of them ends with the call."""
    started, finished = [], []

    async def rollout(model, scenario):
        started.append(scenario["i"])
        try:
            await asyncio.sleep(3600)  # a request the sampler has not answered yet
        finally:
            finished.append(scenario["i"])
        return Trajectory()

    async def go():
        step = asyncio.ensure_future(gather(rollout, None, [{"i": i} for i in range(3)], 2, progress=False))
        while len(started) < 6:
            await asyncio.sleep(0)
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert asyncio.run(go()) == []
    assert sorted(finished) == [0, 0, 1, 1, 2, 2]


def test_rollouts_become_groups_and_a_failure_is_data():
    async def rollout(model, scenario):
        if scenario["i"] == 1 and model == "m":
            raise ValueError("tool crashed")
        return Trajectory(reward=float(scenario["i"]))

    groups = asyncio.run(gather(rollout, "m", [{"i": 0}, {"i": 1}, {"i": 2}], 2, progress=False))
    assert [[t.reward for t in g.trajectories] for g in groups] == [[0.0, 0.0], [0.0, 0.0], [2.0, 2.0]]
    assert [t.error for t in groups[1].trajectories] == ["ValueError: tool crashed"] * 2
    assert [len(g.ok) for g in groups] == [2, 0, 2]


def test_without_a_bar_a_long_batch_writes_a_heartbeat(capsys):
    """Rollouts that finish one by one every 0.2 s, a heartbeat every 0.3 s: lines say how far it is."""

    async def rollout(model, scenario):
        await asyncio.sleep(0.2 * (scenario["i"] + 1))
        return Trajectory()

    async def go():
        return await gather(
            rollout, None, [{"i": i} for i in range(4)], 1, concurrency=4, progress=False,
            description="validation @ 3", heartbeat=0.3,
        )  # fmt: skip

    asyncio.run(go())
    lines = capsys.readouterr().out.splitlines()
    found = [re.fullmatch(r"validation @ 3: (\d)/4 rollouts done after (\d+) s", line) for line in lines]
    assert len(lines) >= 2 and all(found), lines  # rollouts end at 0.2 .. 0.8 s: at 0.3 and 0.6 s at least
    done = [int(m[1]) for m in found]
    assert done == sorted(done) and done[0] < 4
    assert asyncio.run(gather(rollout, None, [{"i": 0}], 1, progress=False)) and capsys.readouterr().out == ""
