"""What crosses the wire between a user's loop and the training service, as JSON.

Only what training needs. Per trajectory: its reward, its named reward signals and metrics
(numbers), and `error` for a rollout that failed (counted, never trained on). Per sampled turn:
the prompt's token ids, the sampled token ids, their sampling logprobs, the adapter version that
sampled them and the temperature. Messages, tools, scenarios and metadata stay on the user's
machine: a scenario's data reaches the service only as the token ids of what the user put in a
message.

These shapes say what each field may hold (a bad one is a 400 naming it); the service checks a
step's groups against its model besides (`grooves.service.validate`: token ids within the
vocabulary, one logprob per sampled token, adapter versions). `to_records` and `to_groups` are the
two directions; a `TrajectoryGroup` that makes the round trip trains exactly as before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup


class _Wire(BaseModel):
    # every float finite: JSON has no inf or nan, and a reward or logprob that is one would train on garbage
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TurnRecord(_Wire):
    """One sampled turn: what `SampledTurn` holds, less its text."""

    prompt_token_ids: list[StrictInt] = Field(min_length=1)
    token_ids: list[StrictInt] = Field(min_length=1)
    logprobs: list[float]
    """The sampling logprob of each of `token_ids`."""
    adapter_version: StrictInt = Field(ge=0)
    """The version of the model's adapter that sampled the turn (each chat completion reports it)."""
    temperature: float = Field(1.0, ge=0, le=2)


class TrajectoryRecord(_Wire):
    reward: float = 0.0
    rewards: dict[str, float] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    turns: list[TurnRecord] = Field(default_factory=list)
    error: str | None = None
    """Set for a rollout that failed: it counts in the step's metrics and is not trained on."""


class GroupRecord(_Wire):
    trajectories: list[TrajectoryRecord] = Field(min_length=1)


class TrainRequest(_Wire):
    """The body of a training step: `POST /v1/trainable_models/{name}/steps`."""

    step: StrictInt = Field(ge=1)
    """This step's id: the model's applied steps + 1. A request whose step was already applied
    (a retry) gets that step's result back and changes nothing."""
    groups: list[GroupRecord] = Field(min_length=1)


def to_records(groups: Sequence[TrajectoryGroup]) -> list[dict[str, Any]]:
    """Groups as the JSON a training step sends; raises `ValueError` naming a turn that no
    adapter version tells where it came from (it was not sampled through the service)."""
    out = []
    for g, group in enumerate(groups):
        trajectories = []
        for t, traj in enumerate(group.trajectories):
            if traj.error is not None:
                trajectories.append({"error": traj.error})
                continue
            turns = []
            for k, turn in enumerate(traj.turns):
                if turn.adapter_version is None:
                    raise ValueError(
                        f"groups[{g}].trajectories[{t}].turns[{k}] has no adapter_version: sample it through "
                        "the service's chat completions, which record the version on every choice"
                    )
                turns.append(
                    {
                        "prompt_token_ids": turn.prompt_token_ids,
                        "token_ids": turn.token_ids,
                        "logprobs": turn.logprobs,
                        "adapter_version": turn.adapter_version,
                        "temperature": turn.temperature,
                    }
                )
            trajectories.append(
                {"reward": traj.reward, "rewards": traj.rewards, "metrics": traj.metrics, "turns": turns}
            )
        out.append({"trajectories": trajectories})
    return out


def to_groups(records: Sequence[GroupRecord]) -> list[TrajectoryGroup]:
    """Validated records as the `TrajectoryGroup`s the training step takes."""
    return [
        TrajectoryGroup(
            trajectories=[
                Trajectory(error=r.error)
                if r.error is not None
                else Trajectory(
                    turns=[
                        SampledTurn(
                            prompt_token_ids=t.prompt_token_ids,
                            token_ids=t.token_ids,
                            logprobs=t.logprobs,
                            adapter_version=t.adapter_version,
                            temperature=t.temperature,
                        )
                        for t in r.turns
                    ],
                    reward=r.reward,
                    rewards=r.rewards,
                    metrics=r.metrics,
                )
                for r in group.trajectories
            ]
        )
        for group in records
    ]
