"""Group-relative advantage estimators: one advantage per completion, from its group's rewards.

Each estimator is a pure function of one group's rewards `[N] -> [N]`, so it can be checked by
hand on a few numbers; `ESTIMATORS` names them for the config. `group_advantages` applies one to
every group of a step and drops the groups whose rewards are all equal: their advantages are zero
everywhere, they carry no gradient, and DAPO's dynamic sampling counts them so the batch can be
refilled and the fraction watched (a loss of 0 on such a step is not a bug signal).

Rewards are computed in float64: judge scores such as 0.35 leave float residue of ~1e-7 between
"equal" rewards, and the std floor, not float32 rounding, should decide what happens to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

ZERO_VARIANCE_TOL = 1e-8
"""A group whose max - min reward is at most this is treated as all-equal and dropped."""


def grpo(
    rewards: torch.Tensor, *, scale_by_std: bool = True, std_floor: float = 1e-3, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantage (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300).

    A_i = (r_i - mean(r)) / (max(std(r), std_floor) + eps), with the population std (divide by N).
    Without `scale_by_std` it is r_i - mean(r), which is `dr_grpo`.

    The floor matters for fractional rewards: a group [0.35, 0.35 + 1e-7, ...] has a std of
    ~5e-8 from float residue, and dividing by it would turn a rounding error into advantages of
    about 1; with the floor they stay about 1e-4.

    >>> grpo(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    tensor([ 1.0000, -1.0000, -1.0000,  1.0000])
    """
    _check_group(rewards)
    centred = rewards - rewards.mean()  # [N]
    if not scale_by_std:
        return centred
    std = rewards.std(correction=0).clamp(min=std_floor)  # []
    return centred / (std + eps)  # [N]


def dr_grpo(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO advantage (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783).

    A_i = r_i - mean(r): no division by the std, which would up-weight groups that are nearly
    all right or all wrong. Pair it with the "constant" loss aggregation.

    >>> dr_grpo(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    tensor([ 0.7500, -0.2500, -0.2500, -0.2500])
    """
    _check_group(rewards)
    return rewards - rewards.mean()  # [N]


def rloo(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, "Back to Basics", arXiv 2402.14740).

    A_i = r_i - mean_{j != i} r_j = N / (N - 1) * (r_i - mean(r)): each completion's baseline
    is the mean of the others, so it is unbiased. Undefined for N = 1.

    >>> rloo(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    tensor([ 1.0000, -0.3333, -0.3333, -0.3333])
    """
    _check_group(rewards)
    n = rewards.numel()
    baseline = (rewards.sum() - rewards) / (n - 1)  # [N]
    return rewards - baseline  # [N]


Estimator = Callable[[torch.Tensor], torch.Tensor]

ESTIMATORS: dict[str, Estimator] = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo}
"""Advantage estimators by config name; each maps one group's rewards [N] to advantages [N]."""


class GroupAdvantages(NamedTuple):
    """Per-group advantages [N_g] (None for a dropped all-equal group) and how many were dropped."""

    advantages: list[torch.Tensor | None]
    num_dropped: int


def group_advantages(
    rewards_per_group: Sequence[Sequence[float]],
    estimator: str,
    *,
    scale_by_std: bool = True,
    std_floor: float = 1e-3,
) -> GroupAdvantages:
    """Advantages for every group of a step, dropping the groups whose rewards are all equal.

    `scale_by_std` and `std_floor` are GRPO's options (see `grpo`); `dr_grpo` and `rloo` do not
    scale by the std and ignore them. Returned tensors are float32, one per group, in order.

    >>> group_advantages([[1.0, 0.0], [0.5, 0.5]], "dr_grpo")
    GroupAdvantages(advantages=[tensor([ 0.5000, -0.5000]), None], num_dropped=1)
    """
    fn = _resolve(estimator, scale_by_std=scale_by_std, std_floor=std_floor)
    out: list[torch.Tensor | None] = []
    dropped = 0
    for rewards in rewards_per_group:
        r = torch.tensor(list(rewards), dtype=torch.float64)  # [N]
        _check_group(r)
        if float(r.max() - r.min()) <= ZERO_VARIANCE_TOL:
            out.append(None)
            dropped += 1
            continue
        out.append(fn(r).to(torch.float32))
    return GroupAdvantages(out, dropped)


def _resolve(name: str, *, scale_by_std: bool, std_floor: float) -> Estimator:
    if name not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; allowed: {', '.join(sorted(ESTIMATORS))}")
    if std_floor <= 0:
        raise ValueError(f"std_floor must be > 0, got {std_floor}; 1e-3 suits rewards in [0, 1]")
    if name == "grpo":
        return lambda r: grpo(r, scale_by_std=scale_by_std, std_floor=std_floor)
    return ESTIMATORS[name]


def _check_group(rewards: torch.Tensor) -> None:
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be one group's 1-D tensor [N], got shape {tuple(rewards.shape)}")
    if rewards.numel() < 2:
        raise ValueError(
            f"a group needs at least 2 completions for a group-relative advantage, got {rewards.numel()}; "
            "raise group_size"
        )
