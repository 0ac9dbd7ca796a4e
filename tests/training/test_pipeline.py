"""Rollouts ahead of the trainer (`rollout.max_staleness`): the version each step samples with,
the staleness check and its metrics, and an exact resume with rollouts in flight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grooves.config import ConfigError, parse_config
from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup
from grooves.training.loop import train
from grooves.training.pipeline import staleness_stats
from run_rows import assert_same_rows


def _config(model_dir, out, **over):
    data = {
        "name": "toy",
        "output_dir": str(out),
        "seed": 1,
        "steps": 5,
        "task": "toy_tokens",
        "task_options": {"vocab_size": 487, "num_scenarios": 16},
        "model": {"base_model": str(model_dir)},
        "rollout": {"group_size": 4, "groups_per_step": 4, "max_tokens": 4, "max_staleness": 1},
        "optim": {"lr": 5e-2, "micro_batch_tokens": 4096},
        "lora": {"rank": 4, "alpha": 8},
        "validation": {"every": 0},
        "logging": {"progress": False, "report": False},
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            data[section][field] = value
        else:
            data[section] = value
    return parse_config(data)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _versions(run_dir: Path, step: int) -> set[int]:
    groups = [
        json.loads(line) for line in (run_dir / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()
    ]
    return {t["adapter_version"] for g in groups for tr in g["trajectories"] for t in tr["turns"]}


def _turn(version: int | None) -> SampledTurn:
    return SampledTurn(prompt_token_ids=[1], token_ids=[2], logprobs=[0.0], adapter_version=version)


def test_the_staleness_check_names_the_versions_and_the_bound():
    group = TrajectoryGroup(trajectories=[Trajectory(turns=[_turn(5), _turn(2)])])
    with pytest.raises(ValueError) as info:
        staleness_stats([group], live=5, max_staleness=2)
    assert str(info.value) == (
        "rollouts were sampled by adapter versions [2], but the live adapter is 5 and "
        "rollout.max_staleness = 2 allows 3..5"
    )
    future = TrajectoryGroup(trajectories=[Trajectory(turns=[_turn(6)])])
    with pytest.raises(
        ValueError, match=r"versions \[6\], but the live adapter is 5 and rollout.max_staleness = 0 allows 5$"
    ):
        staleness_stats([future], live=5, max_staleness=0)
    # a failed rollout and a turn without a version (not from this policy) are not checked
    failed = Trajectory(turns=[_turn(0)], error="boom")
    assert staleness_stats(
        [TrajectoryGroup(trajectories=[failed, Trajectory(turns=[_turn(None)])])], 5, 0
    ) == {
        "staleness_mean": 0.0,
        "staleness_max": 0.0,
        "staleness/0": 0.0,
    }


def test_staleness_needs_local_rollouts():
    with pytest.raises(ConfigError, match='rollout.max_staleness > 0 needs rollout.runner = "local"'):
        parse_config({"rollout": {"max_staleness": 1, "runner": "ray"}})


def test_each_step_samples_with_the_version_k_steps_behind(peaked_model_dir, tmp_path):
    run_dir = train(_config(peaked_model_dir, tmp_path / "run", steps=4, rollout__max_staleness=2))
    rows = [r for r in _rows(run_dir) if "loss" in r]
    # v(t) = max(0, t - 1 - k): steps 1-3 sample with version 0, step 4 with version 1
    assert [_versions(run_dir, t) for t in (1, 2, 3, 4)] == [{0}, {0}, {0}, {1}]
    assert [r["staleness_max"] for r in rows] == [0.0, 1.0, 2.0, 2.0]
    assert [(r["staleness/0"], r["staleness/1"], r["staleness/2"]) for r in rows] == [
        (1.0, 0.0, 0.0),
        (0.0, 1.0, 0.0),
        (0.0, 0.0, 1.0),
        (0.0, 0.0, 1.0),
    ]
    assert all(r["grad_norm"] > 0 for r in rows)  # stale turns still train (the ratio corrects them)
    assert [r["adapter_version"] for r in rows] == [1, 2, 3, 4]
    checkpoint = run_dir / "checkpoints" / "step_000004"
    assert not (checkpoint / "versions").exists()  # the last step: nothing ahead of it to resume
    assert sorted(p.name for p in (checkpoint / "adapter").iterdir()) == [
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
        "base_model.json",
    ]  # the training adapter alone (and its base's record), not the versions served beside it


def test_an_on_policy_run_logs_staleness_zero(peaked_model_dir, tmp_path):
    run_dir = train(_config(peaked_model_dir, tmp_path / "run", steps=2, rollout__max_staleness=0))
    rows = [r for r in _rows(run_dir) if "loss" in r]
    assert [(r["staleness_max"], r["staleness/0"]) for r in rows] == [(0.0, 1.0), (0.0, 1.0)]
    assert [_versions(run_dir, t) for t in (1, 2)] == [{0}, {1}]


@pytest.mark.parametrize("tis_cap", [None, 2.0], ids=["plain", "tis"])
def test_resume_with_rollouts_in_flight_gives_the_same_steps(peaked_model_dir, tmp_path, tis_cap):
    """Stopped after step 2, step 3's rollouts (sampled by version 1) were in flight and are discarded;
    the checkpoint keeps version 1, so the resumed run samples step 3 with the same weights and seeds.
    Under truncated importance sampling the resumed trainer takes version 1's weights from there too,
    for step 3's old logprobs."""
    over = {"algorithm": {"tis_cap": tis_cap}} if tis_cap else {}
    full = _rows(train(_config(peaked_model_dir, tmp_path / "full", **over)))
    part_dir = tmp_path / "part"
    train(_config(peaked_model_dir, part_dir, **over), stop_after=2)
    assert sorted(p.name for p in (part_dir / "checkpoints" / "step_000002" / "versions").iterdir()) == ["v1"]
    resumed = _rows(train(_config(peaked_model_dir, part_dir, **over), resume=True))
    assert [r["step"] for r in resumed] == [r["step"] for r in full] == [0, 1, 2, 3, 4, 5]
    assert [a.keys() for a in full] == [b.keys() for b in resumed]
    assert_same_rows(full, resumed)
    assert _versions(part_dir, 3) == {1} and _versions(part_dir, 5) == {3}
    if tis_cap:  # steps 2-5 train turns one version old: their ratios are taken against that version's
        # weights, and some clip (against the live adapter's own logprobs, sg(lp), none would)
        assert all(r["clip_fraction"] > 0.1 for r in full if r["step"] >= 2 and "loss" in r)
