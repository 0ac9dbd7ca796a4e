"""What crosses the wire between a user's loop and the training service, as JSON.

Only what training needs. Per trajectory: its reward, its named reward signals and metrics
(numbers), and `error` for a rollout that failed (counted, never trained on). Per sampled turn:
the prompt's token ids, the sampled token ids, their sampling logprobs, the adapter version that
sampled them and the temperature. Messages, tools, scenarios and metadata stay on the user's
machine: a scenario's data reaches the service only as the token ids of what the user put in a
message.

These shapes say what each field may hold (a bad one is a 400 naming it): numbers are JSON numbers
(`"1"` and `true` are refused, as the chat endpoint refuses them), finite, and rewards, signals
and metrics at most `MAX_MAGNITUDE` in size; a turn's temperature is 0 (greedy) or at least
`MIN_TEMPERATURE`. The service checks a step's groups against its model besides
(`grooves.training_service.validate`: token ids within the vocabulary, one logprob per sampled token,
adapter versions, the service's limits on a step). `to_records` and `to_groups` are the
two directions; a `TrajectoryGroup` that makes the round trip trains exactly as before it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt

from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup

MAX_MAGNITUDE = 1e15
"""The largest size of a reward, a reward signal or a metric: a step's means and spreads of them
stay finite in float64, and the advantages made from them in float32 (a reward of 1e308
overflowed the step's statistics)."""
MIN_TEMPERATURE = 1e-5
"""The smallest temperature other than 0 (greedy) a turn may report: the sampler samples any
smaller one at this (`policy.sampling`), and the trainer divides the logits by it in float32,
where 1e-300 is 0."""

StrictFloat = Annotated[float, Field(strict=True)]
"""A JSON number: `"1"` and `true` are refused instead of read as 1."""
Number = Annotated[float, Field(strict=True, ge=-MAX_MAGNITUDE, le=MAX_MAGNITUDE)]
"""A reward, signal or metric: a JSON number of size at most `MAX_MAGNITUDE`."""


def _temperature(value: float) -> float:
    if 0 < value < MIN_TEMPERATURE:
        raise ValueError(
            f"{value} is below {MIN_TEMPERATURE}, the smallest temperature besides 0 (greedy) a turn may "
            "report; sample at 0 or at least that"
        )
    return value


class _Wire(BaseModel):
    # every float finite: JSON has no inf or nan, and a reward or logprob that is one would train on garbage
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TurnRecord(_Wire):
    """One sampled turn: what `SampledTurn` holds, less its text."""

    prompt_token_ids: list[StrictInt] = Field(min_length=1)
    token_ids: list[StrictInt] = Field(min_length=1)
    logprobs: list[StrictFloat]
    """The sampling logprob of each of `token_ids`."""
    adapter_version: StrictInt = Field(ge=0)
    """The version of the model's adapter that sampled the turn (each chat completion reports it)."""
    temperature: Annotated[StrictFloat, Field(ge=0, le=2), AfterValidator(_temperature)] = 1.0


class TrajectoryRecord(_Wire):
    reward: Number = 0.0
    rewards: dict[str, Number] = Field(default_factory=dict)
    metrics: dict[str, Number] = Field(default_factory=dict)
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
    out: list[dict[str, Any]] = []
    for g, group in enumerate(groups):
        trajectories: list[dict[str, Any]] = []
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
