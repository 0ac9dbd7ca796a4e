"""Checks of a submitted training step against the model it trains: a bad group is a 400 naming the field.

The wire shapes (`grooves.client.wire`) already refused wrong types, missing fields, inf and nan.
What needs the model is checked here, before anything touches the weights:

- every prompt and sampled token id is an id of the model's vocabulary (0 .. rows of its
  embedding - 1): another id would index out of the embedding;
- each turn has exactly one logprob per sampled token, and each is a log-probability (<= 0, with
  `LOGPROB_SLACK` for float rounding): the sampled-token mask and the old logprobs the loss reads
  come from these, one to one;
- a turn's prompt plus completion fits the model's context;
- each turn's adapter version is not newer than the live adapter (a version from the future was
  not sampled by this model) and at most `rollout.max_staleness` versions older (the model's
  config: the bound the trainer's step holds turns to);
- a trajectory that did not fail has at least one sampled turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from grooves.client.wire import GroupRecord
from grooves.serve.errors import APIError

LOGPROB_SLACK = 1e-4
"""How far above 0 a submitted logprob may be (float rounding of a log-softmax near probability 1)."""


def check_groups(
    groups: Sequence[GroupRecord], *, vocab_size: int, max_context: int, live: int, max_staleness: int
) -> None:
    """Raise `APIError` (400) naming the first field of `groups` that the model cannot train on."""
    for g, group in enumerate(groups):
        for t, traj in enumerate(group.trajectories):
            where = f"groups[{g}].trajectories[{t}]"
            if traj.error is not None:
                continue
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
                if length > max_context:
                    raise _bad(
                        f"{at}.token_ids",
                        f"prompt and completion hold {length} tokens, more than the model's context of {max_context}",
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
