"""Judges in the training loop, on a tiny real model and a judge served over HTTP.

A judge that fails (a 200 that is not JSON, a reply that is no verdict) drops its group and
training goes on; judge_* metrics are logged on every step and on validation; validation is
scored by the same judge, so val/reward_mean is the judge's reward; a judge failing inside a
task's own rollout does not count as a broken agent.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from grooves.config import parse_config
from grooves.core.trajectory import Trajectory, TrajectoryGroup, read_groups
from grooves.judge import GroupJudge
from grooves.rewards import Composite, judge
from grooves.tasks.toy import ToyTokensTask
from grooves.training.loop import train
from scripted_judge import Body, ScriptedServer, group_reply, make_client, shown_responses

JUDGE_KEYS = (
    "judge_items",
    "judge_failures",
    "judge_coverage",
    "judge_seconds",
    "judge_requests",
    "judge_prompt_tokens",
    "judge_completion_tokens",
)
BROKEN = (1, 5)
"""Scenarios ("Write something, number N.") whose judge request gets a 200 that is not JSON."""


def _config(model_dir, out, **over):
    data = {
        "name": "judged",
        "output_dir": str(out),
        "seed": 3,
        "steps": 2,
        "task": "toy_tokens",
        "task_options": {"vocab_size": 487, "num_scenarios": 8},
        "model": {"base_model": str(model_dir)},
        "rollout": {"group_size": 2, "groups_per_step": 4, "max_tokens": 3},
        "optim": {"lr": 1e-2},
        "lora": {"rank": 2, "alpha": 4},
        "validation": {"every": 2, "scenarios": 4, "samples": 2},
        "logging": {"progress": False, "report": False},
    }
    data.update(over)
    return parse_config(data)


def length_score(text: str) -> float:
    """The scripted judge's rule: a response's length in characters, mod 4, over 3."""
    return (len(text) % 4) / 3


def judge_or_break(body: dict):
    if int(re.search(r"number (\d+)", body["messages"][1]["content"]).group(1)) in BROKEN:
        return Body("<html>upstream busy</html>")
    return group_reply(
        {i: length_score(t.removeprefix("[assistant] ")) for i, t in shown_responses(body).items()}
    )


class Judged:
    """What a user passes as `train(config, score=...)`: a group judge whose client is made in the loop."""

    def __init__(self, server: ScriptedServer, tmp_path: Path) -> None:
        self.server, self.tmp_path = server, tmp_path
        self.reward: Composite | None = None

    async def __call__(self, groups: list[TrajectoryGroup]):
        if self.reward is None:
            client = make_client(self.server, self.tmp_path, cache_path=None)
            self.reward = Composite([judge("quality", GroupJudge(client))])
        return await self.reward.score_groups(groups)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_failing_judge_drops_its_groups_and_training_and_validation_go_on(tiny_model_dir, tmp_path):
    with ScriptedServer() as server:
        server.fallback = judge_or_break
        run_dir = train(_config(tiny_model_dir, tmp_path / "run"), score=Judged(server, tmp_path))
    rows = _rows(run_dir)
    steps = [r for r in rows if "reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        assert all(k in row for k in JUDGE_KEYS), sorted(row)
        groups = read_groups(run_dir / "samples" / f"step_{row['step']:06d}.jsonl")
        failed = [t for g in groups for t in g.trajectories if t.error]
        assert len(failed) == 2 * sum(
            g.scenario["prompt"].endswith(tuple(f"number {n}." for n in BROKEN)) for g in groups
        )
        assert all(t.metrics["judge_failed"] == 1.0 and "not a chat completion" in t.error for t in failed)
        assert (row["judge_items"], row["judge_failures"]) == (8, len(failed))
        assert row["judge_coverage"] == pytest.approx((8 - len(failed)) / 8)
        assert row["judge_seconds"] > 0 and row["judge_requests"] == 4
        ok = [t for g in groups for t in g.ok]
        assert row["reward_mean"] == pytest.approx(statistics.fmean(t.rewards["quality"] for t in ok))
    assert sum(r["judge_failures"] for r in steps) > 0  # a broken scenario was drawn and dropped
    # validation (scenarios 4..7, 2 samples each) is scored by the same judge; scenario 5 is dropped
    for row in (rows[0], steps[-1]):
        val = read_groups(run_dir / "samples" / f"validation_{row['step']:06d}.jsonl")
        scored = [t for g in val for t in g.ok]
        assert len(scored) == 6
        assert [t.reward for t in scored] == [t.rewards["quality"] for t in scored]
        assert [t.reward for t in scored] == pytest.approx([length_score(t.completion) for t in scored])
        assert row["val/reward_mean"] == pytest.approx(statistics.fmean(t.reward for t in scored))
        assert (row["val/judge_items"], row["val/judge_failures"], row["val/judge_coverage"]) == (8, 2, 0.75)


class RolloutJudgedTask(ToyTokensTask):
    """A task whose rollout asks a judge itself, one trajectory at a time (as `hn_titles` does)."""

    def __init__(self, server: ScriptedServer, tmp_path: Path) -> None:
        super().__init__(vocab_size=487, num_scenarios=8)
        self.server, self.tmp_path = server, tmp_path
        self.reward: Composite | None = None

    async def rollout(self, model, scenario) -> Trajectory:
        traj = await super().rollout(model, scenario)
        if self.reward is None:
            self.reward = Composite([judge("quality", GroupJudge(make_client(self.server, self.tmp_path)))])
        await self.reward.score_group(TrajectoryGroup(scenario=scenario, trajectories=[traj]))
        return traj


def test_a_judge_failing_inside_rollouts_does_not_stop_the_run(tiny_model_dir, tmp_path):
    with ScriptedServer() as server:
        server.fallback = lambda body: "I think they are all fine."  # never a verdict
        run_dir = train(
            _config(tiny_model_dir, tmp_path / "run", steps=1), task=RolloutJudgedTask(server, tmp_path)
        )
        assert len(server.requests) == 2 * (
            8 + 8 + 8
        )  # request + repair for each rollout: validation, step 1, validation
    step = next(r for r in _rows(run_dir) if r["step"] == 1 and "reward_mean" in r)
    assert (step["rollouts"], step["failed_rollouts"]) == (8.0, 8.0)
    groups = read_groups(run_dir / "samples" / "step_000001.jsonl")
    assert all(
        t.metrics["judge_failed"] == 1.0 and "still invalid after one repair" in t.error
        for g in groups
        for t in g.trajectories
    )
