"""What a judgment is: per-output scores with their provenance, and the `Judge` interface.

Every `Score` names the rubric (name, version, content hash) and the judge model that produced it,
so a score file can be traced back and two versions can never be confused. `GroupJudgment` keeps the
scores in the caller's order (shuffling is undone before anything is returned) plus the position
bias measured when the group was judged twice.
"""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict

from grooves.core.trajectory import TrajectoryGroup
from grooves.judge.rubric import Rubric
from grooves.judge.verdict import ItemVerdict

JudgeMode = Literal["group", "absolute"]


class Score(BaseModel):
    """One output's judgment."""

    model_config = ConfigDict(extra="forbid")

    total: float
    """Weighted mean of the criteria, in [0, 1]."""
    criteria: dict[str, float]
    reason: str
    rubric: str
    rubric_version: str
    rubric_hash: str
    judge_model: str
    mode: JudgeMode
    position_bias: float | None = None
    """|total in shown order - total in reversed order| when judged twice; None otherwise."""

    @classmethod
    def from_verdict(cls, verdict: ItemVerdict, rubric: Rubric, judge_model: str, mode: JudgeMode) -> Score:
        return cls(
            total=verdict.total,
            criteria=dict(verdict.criteria),
            reason=verdict.reason,
            rubric=rubric.name,
            rubric_version=rubric.version,
            rubric_hash=rubric.content_hash,
            judge_model=judge_model,
            mode=mode,
        )


class GroupJudgment(BaseModel):
    """Scores for a group's outputs, in the order they were given."""

    model_config = ConfigDict(extra="forbid")

    scores: list[Score]
    order: list[int]
    """Display order used: order[k] is the index of the output shown k-th (as id t{k+1})."""
    position_bias: float | None = None
    """Mean over outputs of |total(shown order) - total(reversed order)|; None unless judged twice."""


class Judge(Protocol):
    """Anything that scores the successful trajectories of a group (in `group.ok` order)."""

    rubric: Rubric

    async def judge_group(self, group: TrajectoryGroup) -> GroupJudgment: ...
