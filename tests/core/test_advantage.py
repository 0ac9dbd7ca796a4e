"""Advantage estimators against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from grooves.core.advantage import ESTIMATORS, dr_grpo, group_advantages, grpo, rloo


def test_grpo_balanced_group():
    # mean 0.5, population std 0.5 -> +-0.5 / (0.5 + 1e-6)
    a = grpo(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    expected = 0.5 / (0.5 + 1e-6)
    torch.testing.assert_close(a, torch.tensor([expected, -expected, -expected, expected]))


def test_grpo_one_right_of_four():
    # mean 0.25, std sqrt(0.1875) = 0.4330127
    a = grpo(torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64), eps=0.0)
    std = math.sqrt(0.1875)
    torch.testing.assert_close(
        a, torch.tensor([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std], dtype=torch.float64)
    )
    assert a[0].item() == pytest.approx(1.7320508, abs=1e-6)


def test_grpo_without_std_is_dr_grpo():
    r = torch.tensor([2.0, 0.0, 1.0])
    torch.testing.assert_close(grpo(r, scale_by_std=False), torch.tensor([1.0, -1.0, 0.0]))
    torch.testing.assert_close(dr_grpo(r), torch.tensor([1.0, -1.0, 0.0]))


def test_rloo_leave_one_out_baseline():
    # baselines: (1+2)/2, (3+2)/2, (3+1)/2 = 1.5, 2.5, 2
    torch.testing.assert_close(rloo(torch.tensor([3.0, 1.0, 2.0])), torch.tensor([1.5, -1.5, 0.0]))
    torch.testing.assert_close(
        rloo(torch.tensor([1.0, 0.0, 0.0, 0.0])), torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3])
    )


def test_rloo_is_scaled_dr_grpo():
    r = torch.tensor([0.2, 0.9, 0.4, 0.7, 0.1])
    torch.testing.assert_close(rloo(r), 5 / 4 * dr_grpo(r))


def test_std_floor_bounds_float_residue():
    # std from residue is 5e-8; the 1e-3 floor keeps advantages at 5e-8 / 1e-3 = 5e-5
    r = torch.tensor([0.35, 0.35 + 1e-7, 0.35, 0.35 + 1e-7], dtype=torch.float64)
    floored = grpo(r)
    assert floored.abs().max().item() == pytest.approx(5e-8 / (1e-3 + 1e-6), rel=1e-3)
    # a std of 1e-4 (the residue judges leave) would give +-1 unfloored, 0.1 floored
    r = torch.tensor([0.35, 0.3502, 0.35, 0.3502], dtype=torch.float64)
    assert grpo(r, std_floor=1e-12, eps=0.0).abs().max().item() == pytest.approx(1.0, rel=1e-6)
    assert grpo(r, eps=0.0).abs().max().item() == pytest.approx(0.1, rel=1e-6)


def test_group_advantages_std_floor_through_float_list():
    out = group_advantages(
        [[0.35, 0.35 + 1e-7, 0.35, 0.35 + 1e-7]], "grpo", scale_by_std=True, std_floor=1e-3
    )
    assert out.num_dropped == 0
    assert out.advantages[0].abs().max().item() < 1e-4
    assert out.advantages[0].dtype == torch.float32


def test_zero_variance_groups_dropped_and_counted():
    groups = [[1.0, 0.0], [0.5, 0.5, 0.5], [0.1 + 0.25, 0.35], [0.0, 1.0, 1.0]]
    out = group_advantages(groups, "rloo")
    assert out.num_dropped == 2
    assert out.advantages[1] is None and out.advantages[2] is None
    torch.testing.assert_close(out.advantages[0], torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(out.advantages[3], torch.tensor([-1.0, 0.5, 0.5]))


def test_group_advantages_passes_grpo_options():
    scaled = group_advantages([[1.0, 0.0, 0.0, 0.0]], "grpo", scale_by_std=True, std_floor=1e-3)
    plain = group_advantages([[1.0, 0.0, 0.0, 0.0]], "grpo", scale_by_std=False, std_floor=1e-3)
    assert scaled.advantages[0][0].item() == pytest.approx(0.75 / (math.sqrt(0.1875) + 1e-6), abs=1e-5)
    torch.testing.assert_close(plain.advantages[0], torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_unknown_estimator_lists_allowed():
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'; allowed: dr_grpo, grpo, rloo"):
        group_advantages([[1.0, 0.0]], "ppo")


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_group_of_one_is_an_error(name):
    with pytest.raises(ValueError, match="at least 2 completions"):
        ESTIMATORS[name](torch.tensor([1.0]))
    with pytest.raises(ValueError, match="at least 2 completions"):
        group_advantages([[1.0, 0.0], [1.0]], name)


def test_bad_std_floor_is_an_error():
    with pytest.raises(ValueError, match="std_floor must be > 0"):
        group_advantages([[1.0, 0.0]], "grpo", std_floor=0.0)
