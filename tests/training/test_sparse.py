"""Sparse rewards: the warning line, the report's sentence, and refilling steps with groups that teach."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from grooves.config import parse_config
from grooves.tasks.toy import ToyTokensTask
from grooves.training.data import ScenarioStream
from grooves.training.loop import train
from grooves.training.sparse import SparseRewardWarning, has_signal, refill_count
from run_rows import assert_same_rows


class FlatTask(ToyTokensTask):
    """Toy tokens, but scenarios whose number is in `flat` score 0 whatever is sampled."""

    def __init__(self, flat: set[int], **options):
        super().__init__(**options)
        self.flat = flat

    async def rollout(self, model, scenario):
        traj = await super().rollout(model, scenario)
        if int(scenario["prompt"].split()[-1].rstrip(".")) in self.flat:
            traj.reward = 0.0
        return traj


def _config(model_dir, out, report=False, **rollout):
    return parse_config(
        {
            "name": "sparse",
            "output_dir": str(out),
            "seed": 1,
            "steps": 4,
            "task": "toy_tokens",
            "model": {"base_model": str(model_dir)},
            "rollout": {"group_size": 6, "groups_per_step": 2, "max_tokens": 6, **rollout},
            "optim": {"lr": 1e-2},
            "lora": {"rank": 4, "alpha": 8},
            "validation": {"every": 0, "scenarios": 2, "samples": 1},
            "logging": {"progress": False, "report": report},
            "checkpoint": {"every": 1},
        }
    )


def _steps(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


TASK = {"vocab_size": 487, "num_scenarios": 16}  # train: numbers 0..7


def _expected_draws(flat: set[int], steps: int, per_step: int, bound: int) -> list[int]:
    """Replay the run's scenario stream: per step, the extra scenarios refilling draws."""
    train_numbers = list(range(8))
    stream = ScenarioStream(train_numbers, seed=1)
    out = []
    for _ in range(steps):
        signal = sum(n not in flat for _, n in stream.take(per_step))
        drawn = 0
        while more := refill_count(per_step, signal, drawn, bound):
            signal += sum(n not in flat for _, n in stream.take(more))
            drawn += more
        out.append(drawn)
    return out


def test_pure_rules():
    assert has_signal([0.0, 0.25]) and not has_signal([0.5] * 6) and not has_signal([1.0])
    assert [refill_count(4, s, d, 3) for s, d in [(0, 0), (3, 0), (0, 2), (0, 3), (4, 0)]] == [3, 1, 1, 0, 0]
    lines = []
    warn = SparseRewardWarning(0.5, every=10, say=lines.append)
    flags = [warn.observe(step, zero, 4) for step, zero in [(1, 1), (2, 2), (3, 4), (12, 3)]]
    assert flags == [False, True, True, True]
    assert len(lines) == 2  # step 2, then not again until 10 steps later (step 12)
    assert (
        lines[0].startswith("step 2: 2 of 4 groups (50%) had all-equal rewards")
        and "refill_zero_variance" in lines[0]
    )
    # with refills: a step whose draws found every group it wanted is not sparse, however many tied
    refilled = SparseRewardWarning(0.5, every=10, say=lines.append)
    assert [refilled.observe(step, 6, 8, refill_short=short) for step, short in [(1, 0), (2, 2)]] == [
        False,
        True,
    ]
    assert lines[-1].startswith("step 2: 6 of 8 groups (75%)")
    assert "max_refill_draws ran out 2 group(s) short of groups_per_step" in lines[-1]


def test_a_run_that_starts_warm_is_not_told_to_start_warm():
    lines = []
    SparseRewardWarning(0.5, say=lines.append, warm=True).observe(3, 4, 4)
    assert lines == [
        "step 3: 4 of 4 groups (100%) had all-equal rewards and teach nothing (1 such step(s) so far); set "
        "rollout.refill_zero_variance = true to draw more scenarios, raise rollout.temperature or group_size, "
        "or train the warm start further (more demonstrations or [sft] steps: this run already starts from "
        "model.init_adapter)"
    ]


def test_a_run_with_flat_groups_warns_in_one_line_and_in_the_report(tiny_model_dir, tmp_path, capsys):
    task = FlatTask(set(range(8)), **TASK)
    run_dir = train(_config(tiny_model_dir, tmp_path / "run", report=True), task=task)
    rows = _steps(run_dir)
    assert [r["groups_zero_variance_fraction"] for r in rows] == [1.0] * 4
    assert [r["sparse_rewards"] for r in rows] == [1.0] * 4 and all(r["refill_draws"] == 0 for r in rows)
    lines = [line for line in capsys.readouterr().err.splitlines() if "all-equal" in line]
    assert lines == [
        "step 1: 2 of 2 groups (100%) had all-equal rewards and teach nothing (1 such step(s) so far); set "
        "rollout.refill_zero_variance = true to draw more scenarios, raise rollout.temperature or group_size, "
        "or start from a warm adapter (model.init_adapter, or an [sft] stage)"
    ]
    report = (run_dir / "report.html").read_text()
    assert "Sparse rewards: 100% of groups had all-equal rewards" in report and "4 of 4 steps" in report


def test_refill_draws_until_the_step_has_groups_with_signal(tiny_model_dir, tmp_path, capsys):
    flat = {0, 1, 2, 4, 5, 6}  # numbers 3 and 7 give rewards that differ
    config = _config(tiny_model_dir, tmp_path / "run", refill_zero_variance=True, max_refill_draws=8)
    rows = _steps(train(config, task=FlatTask(flat, **TASK)))
    assert [r["sparse_rewards"] for r in rows] == [0.0] * 4  # every step found its groups: no warning
    assert "all-equal" not in capsys.readouterr().err
    draws = _expected_draws(flat, 4, 2, 8)
    assert [r["refill_draws"] for r in rows] == draws and sum(draws) > 0
    assert [r["rollouts"] for r in rows] == [(2 + d) * 6 for d in draws]
    assert [r["groups_with_signal"] for r in rows] == [2.0] * 4  # each step found its two
    assert [r["groups_zero_variance_fraction"] for r in rows] == [d / (2 + d) for d in draws]


def test_refill_stops_at_its_bound(tiny_model_dir, tmp_path, capsys):
    config = _config(tiny_model_dir, tmp_path / "run", True, refill_zero_variance=True, max_refill_draws=3)
    run_dir = train(config, task=FlatTask(set(range(8)), **TASK))
    rows = _steps(run_dir)
    assert [r["refill_draws"] for r in rows] == [3.0] * 4
    assert [r["rollouts"] for r in rows] == [30.0] * 4  # (2 + 3) x 6, never more
    assert [r["groups_with_signal"] for r in rows] == [0.0] * 4
    assert "rollout.max_refill_draws ran out 2 group(s) short" in capsys.readouterr().err
    assert "drew 12 extra scenarios" in (run_dir / "report.html").read_text()
    state = json.loads((run_dir / "checkpoints" / "step_000004" / "state.json").read_text())
    assert state["data_position"] == 4 * (2 + 3)


class SlowFlatTask(FlatTask):
    """FlatTask whose every rollout takes at least `delay` seconds; its scoring takes none."""

    def __init__(self, flat: set[int], delay: float, **options):
        super().__init__(flat, **options)
        self.delay = delay

    async def rollout(self, model, scenario):
        await asyncio.sleep(self.delay)
        return await super().rollout(model, scenario)


def test_refill_rollouts_count_as_rollout_time_not_scoring_time(tiny_model_dir, tmp_path):
    # every group ties, so each step refills to its bound of 3 scenarios in two rounds (2, then the 1
    # left): three rounds of rollouts, each at least `delay` (a round's rollouts run concurrently)
    delay = 0.3
    config = _config(tiny_model_dir, tmp_path / "run", refill_zero_variance=True, max_refill_draws=3)
    config = config.model_copy(update={"steps": 2})
    rows = _steps(train(config, task=SlowFlatTask(set(range(8)), delay, **TASK)))
    assert [r["refill_draws"] for r in rows] == [3.0, 3.0]
    for row in rows:
        assert row["seconds_rollout"] >= 3 * delay
        assert row["seconds_score"] < delay  # the task scores in its rollout: nothing is left here
        parts = row["seconds_rollout"] + row["seconds_score"] + row["seconds_train"]
        assert parts <= row["seconds_step"] + 1e-6


def test_a_resumed_run_refills_exactly_as_one_that_never_stopped(tiny_model_dir, tmp_path):
    flat = {0, 1, 2, 4, 5, 6}
    config = lambda out: _config(tiny_model_dir, out, refill_zero_variance=True, max_refill_draws=8)  # noqa: E731
    full = _steps(train(config(tmp_path / "full"), task=FlatTask(flat, **TASK)))
    part = tmp_path / "part"
    train(config(part), task=FlatTask(flat, **TASK), stop_after=2)
    resumed = _steps(train(config(part), task=FlatTask(flat, **TASK), resume=True))
    assert [r["refill_draws"] for r in resumed] == [r["refill_draws"] for r in full]
    assert_same_rows(full, resumed, ("rollouts", "reward_mean", "groups_with_signal", "loss", "grad_norm"))


def test_refill_is_refused_with_rollouts_ahead_of_the_trainer(tiny_model_dir, tmp_path):
    from grooves.config import ConfigError

    with pytest.raises(ConfigError, match=r"rollout.refill_zero_variance needs max_staleness = 0"):
        _config(tiny_model_dir, tmp_path / "run", refill_zero_variance=True, max_staleness=1)
