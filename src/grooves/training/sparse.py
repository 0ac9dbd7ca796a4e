"""Sparse rewards: groups whose rollouts all scored alike, the warning that says so, and refills.

A group of equal rewards has zero advantage for every rollout (GRPO's advantages are relative to
the group), so it adds nothing to the gradient: a step where most groups are like that learns
from the few others, and a step where all are learns nothing. `SparseRewardWarning` says so on one
line during the run; `rollout.refill_zero_variance` (in `training.collect`) draws more scenarios
instead, DAPO's dynamic sampling (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement
Learning System at Scale", arXiv:2503.14476, section 3.2).
"""

from __future__ import annotations

from collections.abc import Sequence

from grooves.core.advantage import ZERO_VARIANCE_TOL
from grooves.core.trajectory import TrajectoryGroup


def has_signal(rewards: Sequence[float]) -> bool:
    """True when a group's rewards differ: at least two, with max - min > `ZERO_VARIANCE_TOL`
    (the rule `core.advantage.group_advantages` drops groups by).

    >>> has_signal([1.0, 0.0]), has_signal([0.5, 0.5]), has_signal([1.0])
    (True, False, False)
    """
    return len(rewards) >= 2 and max(rewards) - min(rewards) > ZERO_VARIANCE_TOL


def groups_with_signal(groups: Sequence[TrajectoryGroup]) -> int:
    """How many groups train: their successful rollouts' rewards differ."""
    return sum(has_signal(g.rewards) for g in groups)


def refill_count(groups_per_step: int, with_signal: int, drawn: int, max_draws: int) -> int:
    """Scenarios to draw next: the groups with signal still missing, within the step's bound.

    >>> refill_count(4, 1, 0, 8), refill_count(4, 1, 6, 8), refill_count(4, 4, 0, 8)
    (3, 2, 0)
    """
    return max(0, min(groups_per_step - with_signal, max_draws - drawn))


class SparseRewardWarning:
    """One line when a step's share of equal-reward groups reaches `threshold`, at most once per
    `every` steps (a run of flat steps is one problem, not one line per step)."""

    def __init__(self, threshold: float, every: int = 10, say=print, warm: bool = False):
        self.threshold = threshold
        self.every = every
        self.say = say
        self.warm = warm
        """The run starts from a trained adapter (`model.init_adapter`, or an `[sft]` stage's)."""
        self.flagged = 0  # steps at or over the threshold so far (this process)
        self.last: int | None = None

    def observe(self, step: int, zero_variance: int, groups: int, refill_short: int | None = None) -> bool:
        """Note a step's count of equal-reward groups; True when the step is sparse.

        `refill_short` is None without `rollout.refill_zero_variance`: the step is sparse when its
        share of equal-reward groups reaches the threshold. With refills it is how many groups with
        signal the step still lacked when the draws stopped: a step whose refills found all it
        wanted is not sparse, however many tied groups they passed over (those are logged as
        `groups_zero_variance_fraction`); one that ran out of draws is.
        """
        if refill_short is not None:
            sparse = refill_short > 0 and groups > 0
        else:
            sparse = groups > 0 and zero_variance / groups >= self.threshold
        if not sparse:
            return False
        self.flagged += 1
        if self.last is None or step - self.last >= self.every:
            self.last = step
            advice = (
                f"rollout.max_refill_draws ran out {refill_short} group(s) short of groups_per_step"
                if refill_short is not None
                else "set rollout.refill_zero_variance = true to draw more scenarios"
            )
            start = (
                "train the warm start further (more demonstrations or [sft] steps: this run already starts "
                "from model.init_adapter)"
                if self.warm
                else "start from a warm adapter (model.init_adapter, or an [sft] stage)"
            )
            self.say(
                f"step {step}: {zero_variance} of {groups} groups ({zero_variance / groups:.0%}) had all-equal "
                f"rewards and teach nothing ({self.flagged} such step(s) so far); {advice}, raise "
                f"rollout.temperature or group_size, or {start}"
            )
        return True
