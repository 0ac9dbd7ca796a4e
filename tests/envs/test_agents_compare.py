"""benchmarks/agents_compare.py: episodes pooled from both sample formats, compared scenario by scenario."""

import json

import pytest
from agents_compare import (
    add_earlier,
    earlier_episodes,
    load,
    newcombe_difference,
    paired_difference,
    summary,
)

from grooves.report.intervals import wilson_interval


def _traj(scenario: str, reward: float, error: str | None = None) -> dict:
    return {"reward": reward, "error": error, "metadata": {"scenario_id": scenario}, "messages": []}


def _write(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_eval_files_and_a_runs_validation_groups_pool_into_the_same_episodes(tmp_path):
    eval_file = tmp_path / "eval.jsonl"  # agents_eval --samples-out: a trajectory a line
    _write(eval_file, [_traj("s1", 1.0), _traj("s1", 0.4), _traj("s2", 0.0)])
    groups = tmp_path / "validation_000005.jsonl"  # the trainer's validation: a group a line
    _write(
        groups,
        [
            {"scenario": {"id": "s1"}, "trajectories": [_traj("s1", 1.0), _traj("s1", 0.0, error="timeout")]},
            {"scenario": {"id": "s2"}, "trajectories": [_traj("s2", 1.0), _traj("s2", 0.2)]},
        ],
    )
    episodes = load([eval_file, groups])
    # the failed rollout is left out, as the run's validation leaves it out
    assert episodes == {
        "s1": [(1.0, True), (0.4, False), (1.0, True)],
        "s2": [(0.0, False), (1.0, True), (0.2, False)],
    }
    s = summary(episodes)
    assert s["episodes"] == 6 and s["success"] == pytest.approx(3 / 6)
    assert s["reward"] == pytest.approx((1.0 + 0.4 + 1.0 + 0.0 + 1.0 + 0.2) / 6)
    assert s["successes_per_scenario"] == {"s1": 2, "s2": 1}


def test_the_paired_difference_counts_scenarios_and_bootstraps_over_them():
    a = {"s1": [(0.0, False), (0.0, False)], "s2": [(1.0, True), (0.0, False)], "s3": [(1.0, True)] * 2}
    b = {"s1": [(1.0, True), (1.0, True)], "s2": [(1.0, True), (0.0, False)], "s3": [(0.0, False)] * 2}
    d = paired_difference(a, b, resamples=2000)
    # per scenario b - a: +1, 0, -1
    assert d["difference"] == pytest.approx(0.0)
    assert (d["scenarios_b_better"], d["scenarios_b_worse"], d["scenarios_equal"]) == (1, 1, 1)
    # a resample of three -1s (or three +1s) has probability 1/27 = 3.7%, more than the 2.5% tail
    assert (d["ci_low"], d["ci_high"]) == (-1.0, 1.0)
    assert d["scenarios"] == 3


def test_newcombes_interval_matches_the_papers_example():
    # Newcombe 1998, table II, example (a): 56/70 against 48/80, method 10: +0.0524 to +0.3339
    a = dict(zip(("ci_low", "ci_high"), wilson_interval(48, 80), strict=True), success=48 / 80)
    b = dict(zip(("ci_low", "ci_high"), wilson_interval(56, 70), strict=True), success=56 / 70)
    low, high = newcombe_difference(a, b)
    assert low == pytest.approx(0.0524, abs=2e-4) and high == pytest.approx(0.3339, abs=2e-4)


def test_an_earlier_comparisons_counts_pool_in_as_episodes_with_its_mean_reward(tmp_path):
    new = tmp_path / "new.jsonl"
    _write(new, [_traj("s1", 1.0), _traj("s2", 0.5)])
    earlier = {"episodes": 4, "reward": 0.6, "successes_per_scenario": {"s1": 2, "s2": 1}}
    episodes = load([new])
    add_earlier(episodes, earlier)
    s = summary(episodes)
    assert s["episodes"] == 6 and s["successes_per_scenario"] == {"s1": 3, "s2": 1}
    # the pooled mean reward is exact: 4 earlier episodes at their mean 0.6, then 1.0 and 0.5
    assert s["reward"] == pytest.approx((4 * 0.6 + 1.0 + 0.5) / 6)
    with pytest.raises(ValueError, match="not the same number per scenario"):
        earlier_episodes({"episodes": 5, "reward": 0.1, "successes_per_scenario": {"s1": 1, "s2": 0}})
