"""Per-row changes to next-token logits before sampling: OpenAI's logit_bias and penalties.

Each sampled row may carry a few `RowLogits` hooks. Before a token is drawn, every hook of the row
changes that row's logits in place (`apply`); once the token is drawn, each hook hears it
(`advance`). The grammar masks of constrained decoding (`policy/constraints.py`) are hooks of the
same shape. The order is fixed: logit bias, then penalties, then the grammar mask, then the
temperature, so a bias cannot bring back a token the grammar forbids.

The sampled logprob a completion records is taken from the changed logits: it is the logprob of
the distribution the token was drawn from. The trainer recomputes plain logprobs, so a request that
used any of these hooks shows up as sampler/trainer mismatch (`mismatch_k3_mean`); training runs do
not use them unless a task asks (docs/serving.md, "Sampled logprobs").
"""

from __future__ import annotations

from typing import Protocol

import torch

LOGIT_BIAS_RANGE = (-100.0, 100.0)
PENALTY_RANGE = (-2.0, 2.0)
"""The ranges OpenAI's API accepts for logit_bias values and for the two penalties."""


class RowLogits(Protocol):
    """A hook on one row's next-token logits."""

    def apply(self, logits: torch.Tensor) -> None:
        """Change this row's logits [V] (float32, before the temperature) in place."""
        ...

    def advance(self, token: int) -> None:
        """The token this row sampled from the logits `apply` saw."""
        ...


def penalized(logits: torch.Tensor, counts: torch.Tensor, frequency: float, presence: float) -> torch.Tensor:
    """OpenAI's frequency and presence penalties on logits [..., V] given token counts [..., V].

    mu_j <- mu_j - c_j * frequency - [c_j > 0] * presence, where c_j is how often token j was
    sampled so far in this completion (not the prompt), as the OpenAI API reference defines them
    ("Parameter details", frequency and presence penalties). Positive values lower the logits of
    tokens already sampled, the frequency penalty in proportion to their count.

    >>> penalized(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.0, 1.0, 3.0]), 0.5, 0.25).tolist()
    [1.0, 0.25, -0.75]
    """
    return logits - counts * frequency - (counts > 0).to(logits.dtype) * presence


class LogitBias:
    """`logit_bias`: adds a fixed value to the logits of chosen token ids (-100 all but bans a token)."""

    def __init__(self, bias: dict[int, float], vocab_size: int):
        for token, value in bias.items():
            if not 0 <= token < vocab_size:
                raise ValueError(
                    f"logit_bias token {token} is not a token id of this model (0 .. {vocab_size - 1})"
                )
            if not LOGIT_BIAS_RANGE[0] <= value <= LOGIT_BIAS_RANGE[1]:
                raise ValueError(
                    f"logit_bias value {value} for token {token} is outside {list(LOGIT_BIAS_RANGE)}"
                )
        self.ids = torch.tensor(sorted(bias), dtype=torch.long)
        self.values = torch.tensor([float(bias[t]) for t in sorted(bias)], dtype=torch.float32)

    def apply(self, logits: torch.Tensor) -> None:
        logits.index_add_(0, self.ids.to(logits.device), self.values.to(logits.device, logits.dtype))

    def advance(self, token: int) -> None:
        pass


class Penalties:
    """`frequency_penalty` and `presence_penalty` (see `penalized`), counting this row's sampled tokens."""

    def __init__(self, frequency: float, presence: float, vocab_size: int):
        for name, value in (("frequency_penalty", frequency), ("presence_penalty", presence)):
            if not PENALTY_RANGE[0] <= value <= PENALTY_RANGE[1]:
                raise ValueError(f"{name}={value} is outside {list(PENALTY_RANGE)}")
        self.frequency, self.presence = float(frequency), float(presence)
        self.counts = torch.zeros(vocab_size, dtype=torch.float32)  # [V]

    def apply(self, logits: torch.Tensor) -> None:
        counts = self.counts.to(logits.device)
        logits.copy_(penalized(logits, counts[: logits.shape[-1]], self.frequency, self.presence))

    def advance(self, token: int) -> None:
        self.counts[token] += 1


def top_logprobs(logp: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
    """The k most likely tokens of each row of logp [R, V], as (token id, logprob), most likely first.

    >>> top_logprobs(torch.log(torch.tensor([[0.1, 0.6, 0.3]])), 2)
    [[(1, -0.5108255743980408), (2, -1.2039728164672852)]]
    """
    if k <= 0:
        return [[] for _ in range(logp.shape[0])]
    values, order = torch.topk(logp, min(k, logp.shape[-1]), dim=-1)  # [R, k]
    return [
        list(zip(ids, vals, strict=True)) for ids, vals in zip(order.tolist(), values.tolist(), strict=True)
    ]
