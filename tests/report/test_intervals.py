"""The 95% intervals `grooves eval` reports, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from grooves.core.trajectory import Trajectory, TrajectoryGroup
from grooves.report.intervals import Z95, bootstrap_interval, wilson_interval
from grooves.training.evaluate import summarize


def test_wilson_interval_is_the_score_interval():
    # 27 of 108: p = 0.25, z^2/n = 0.035569; center = (0.25 + 0.017785) / 1.035569 = 0.258587
    # half = 1.959964 / 1.035569 * sqrt(0.25 * 0.75 / 108 + 3.841459 / 46656) = 0.080709
    low, high = wilson_interval(27, 108)
    assert (low, high) == pytest.approx((0.258587 - 0.080709, 0.258587 + 0.080709), abs=2e-6)
    assert wilson_interval(20, 20)[1] == 1.0 and wilson_interval(20, 20)[0] == pytest.approx(
        0.83887, abs=1e-5
    )
    assert Z95 == pytest.approx(1.959963984540054)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


def test_bootstrap_resamples_whole_scenarios():
    # every scenario's samples agree: the interval is that of 4 values, not of 400
    agreeing = [[1.0] * 100, [0.0] * 100, [1.0] * 100, [0.0] * 100]
    independent = [[1.0, 0.0] * 50 for _ in range(4)]
    low, high = bootstrap_interval(agreeing, seed=0)
    assert low <= 0.25 and high >= 0.75  # four scenarios say little
    low, high = bootstrap_interval(independent, seed=0)
    assert (low, high) == (0.5, 0.5)  # each scenario's mean is 0.5: every resample's is too
    assert bootstrap_interval(agreeing, seed=3) == bootstrap_interval(agreeing, seed=3)  # seeded


def test_bootstrap_matches_a_direct_resampling():
    clusters = [[0.2, 0.4], [0.9], [0.1, 0.3, 0.5]]
    rng = np.random.default_rng(7)
    picks = rng.integers(0, 3, size=(10_000, 3))
    means = [sum(sum(clusters[i]) for i in row) / sum(len(clusters[i]) for i in row) for row in picks]
    assert bootstrap_interval(clusters, seed=7) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))


def _group(rewards, success=True, failed=0):
    trajs = [Trajectory(reward=r, metrics={"success": float(r > 0.5)} if success else {}) for r in rewards]
    trajs += [Trajectory(error="boom") for _ in range(failed)]
    return TrajectoryGroup(trajectories=trajs)


def test_summarize_counts_failures_apart_and_reports_missing_success():
    groups = [_group([1.0, 0.0], failed=1), _group([1.0, 1.0])]
    got = summarize(groups)
    assert (got["scenarios"], got["rollouts"], got["failed"]) == (2, 5, 1)
    assert got["success"]["mean"] == 0.75
    assert (got["success"]["low"], got["success"]["high"]) == wilson_interval(3, 4)
    assert got["reward"]["mean"] == 0.75
    assert summarize([_group([0.3, 0.7], success=False)])["success"] is None
