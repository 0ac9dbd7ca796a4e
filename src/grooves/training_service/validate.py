"""Checks of a submitted training step: its size against the service's limits, its groups against the
model it trains. A step past a limit is a 413 naming the setting; a bad group is a 400 naming the field.

The wire shapes (`grooves.remote.wire`) already refused wrong types, missing fields, inf and nan.
`check_size` holds a step to the service's `StepLimits` (what one step may cost the shared base:
its token ids and its trajectories) before anything else reads it. What needs the model is
checked by `check_groups`, before anything touches the weights:

- every prompt and sampled token id is an id of the model's vocabulary (0 .. rows of its
  embedding - 1): another id would index out of the embedding;
- each turn has exactly one logprob per sampled token, and each is a log-probability (<= 0, with
  `LOGPROB_SLACK` for float rounding): the sampled-token mask and the old logprobs the loss reads
  come from these, one to one;
- a turn's prompt plus completion (the longest training sequence it makes) fits every bound on
  one sequence: the model's context, the service's `--max-sequence-tokens`, and the widest row
  one of the model's micro-batches holds (`optim.micro_batch_tokens` with attention's T x T
  memory counted, `core.batching.longest_row`);
- each turn's adapter version is not newer than the live adapter (a version from the future was
  not sampled by this model) and at most `rollout.max_staleness` versions older (the model's
  config: the bound the trainer's step holds turns to);
- a trajectory that did not fail has at least one sampled turn, and some group has two
  trajectories that did not fail (a group's advantages compare its rollouts: without such a
  group the step has nothing to train).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grooves.remote.wire import GroupRecord, TrajectoryRecord
from grooves.serve.errors import APIError

LOGPROB_SLACK = 1e-4
"""How far above 0 a submitted logprob may be (float rounding of a log-softmax near probability 1)."""
MAX_STEP_TOKENS = 65_536
"""Default of `--max-step-tokens`: the prompt and sampled token ids one step may carry in all."""
MAX_STEP_TRAJECTORIES = 1_024
"""Default of `--max-step-trajectories`: a step of 16,000 held the shared base for 31-42 s."""
MAX_SEQUENCE_TOKENS = 8_192
"""Default of `--max-sequence-tokens`: one turn's prompt plus completion."""


@dataclass(frozen=True)
class StepLimits:
    """What one step may hold, whichever model it trains (`grooves serve --train` options)."""

    max_step_tokens: int = MAX_STEP_TOKENS
    max_step_trajectories: int = MAX_STEP_TRAJECTORIES
    max_sequence_tokens: int = MAX_SEQUENCE_TOKENS

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")


@dataclass(frozen=True)
class SequenceBound:
    """A bound on one training sequence's tokens, and what it is, for the 400's message."""

    tokens: int
    what: str


def check_size(groups: Sequence[GroupRecord], limits: StepLimits) -> None:
    """Raise `APIError` (413, param `groups`) for a step past the service's trajectories or token ids."""
    trajectories = sum(len(g.trajectories) for g in groups)
    if trajectories > limits.max_step_trajectories:
        raise _too_large(
            f"the step holds {trajectories} trajectories, more than this service's limit of "
            f"{limits.max_step_trajectories} per step (--max-step-trajectories); send fewer groups per step"
        )
    tokens = sum(
        len(turn.prompt_token_ids) + len(turn.token_ids)
        for g in groups
        for t in g.trajectories
        for turn in t.turns
    )
    if tokens > limits.max_step_tokens:
        raise _too_large(
            f"the step's turns hold {tokens} prompt and sampled token ids, more than this service's limit of "
            f"{limits.max_step_tokens} per step (--max-step-tokens); send fewer or shorter rollouts per step"
        )


def check_groups(
    groups: Sequence[GroupRecord],
    *,
    vocab_size: int,
    sequence: Sequence[SequenceBound],
    live: int,
    max_staleness: int,
) -> None:
    """Raise `APIError` (400) naming the first field of `groups` that the model cannot train on;
    `sequence` holds the bounds on one turn's prompt plus completion."""
    bound = min(sequence, key=lambda b: b.tokens)
    for g, group in enumerate(groups):
        for t, traj in enumerate(group.trajectories):
            if traj.error is None:
                _check_trajectory(
                    traj, f"groups[{g}].trajectories[{t}]", vocab_size, bound, live, max_staleness
                )
    if not any(sum(t.error is None for t in g.trajectories) >= 2 for g in groups):
        raise _bad(
            "groups",
            "no group has two trajectories that did not fail, so the step has nothing to train (a group's "
            "advantages compare its rollouts); send groups with at least two rollouts that did not fail",
        )


def _check_trajectory(
    traj: TrajectoryRecord, where: str, vocab_size: int, bound: SequenceBound, live: int, max_staleness: int
) -> None:
    if not traj.turns:
        raise _bad(f"{where}.turns", "a trajectory that did not fail needs at least one sampled turn")
    for k, turn in enumerate(traj.turns):
        at = f"{where}.turns[{k}]"
        for field in ("prompt_token_ids", "token_ids"):
            ids = getattr(turn, field)
            if min(ids) < 0 or max(ids) >= vocab_size:
                i = next(i for i, x in enumerate(ids) if not 0 <= x < vocab_size)
                raise _bad(
                    f"{at}.{field}[{i}]",
                    f"{ids[i]} is not a token id of this model (its ids are 0..{vocab_size - 1})",
                )
        if len(turn.logprobs) != len(turn.token_ids):
            raise _bad(
                f"{at}.logprobs",
                f"{len(turn.logprobs)} logprobs for {len(turn.token_ids)} token_ids; "
                "send one sampling logprob per sampled token",
            )
        if turn.logprobs and max(turn.logprobs) > LOGPROB_SLACK:
            i = next(i for i, x in enumerate(turn.logprobs) if x > LOGPROB_SLACK)
            raise _bad(f"{at}.logprobs[{i}]", f"{turn.logprobs[i]} is not a log-probability (> 0)")
        length = len(turn.prompt_token_ids) + len(turn.token_ids)
        if length > bound.tokens:
            raise _bad(
                f"{at}.token_ids", f"prompt and completion hold {length} tokens, more than {bound.what}"
            )
        version = turn.adapter_version
        if version > live:
            raise _bad(
                f"{at}.adapter_version",
                f"{version} is newer than the model's live adapter (version {live}): "
                "this turn was not sampled from this model",
            )
        if live - version > max_staleness:
            raise _bad(
                f"{at}.adapter_version",
                f"{version} is {live - version} versions behind the live adapter (version {live}); "
                f"this model takes turns at most {max_staleness} behind (rollout.max_staleness): "
                "sample the group again",
            )


def _bad(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param)


def _too_large(message: str) -> APIError:
    return APIError(413, f"groups: {message}", "groups", "step_too_large")
