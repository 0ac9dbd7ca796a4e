"""A step's training sequences as micro-batches: the group's shared prompt once, the rest packed or padded.

One optimizer step accumulates the gradients of several forward/backward passes, each of at most
about `optim.micro_batch_tokens` tokens (memory bounds it). A row's attention costs memory per
pair of its positions besides per token (`training.memory`): with `pair_cost` (tokens per pair) a
row of width T counts T + pair_cost T^2 tokens, so a micro-batch holds fewer long rows, and no
row is wider than `longest_row`. How sequences are laid out in them:

- `share_prefix`: the rollouts of one group start with the same prompt, so a group goes into its
  own padded micro-batches whose common prefix `forward.shared_prefix_logprobs` computes once;
- the sequences left over (groups without a worthwhile common prefix, or `share_prefix` off) are
  packed several to a row (`packing`, block-diagonal attention) or padded one to a row.

Either way the sequences of one rollout (a trajectory split at a prefix break) go into one
micro-batch, even past the budget: the loss takes each rollout whole (GSPO's ratio, sequence_mean).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from grooves.config import AdamWConfig
from grooves.core.tokenize import TrainBatch, TrainSequence, pack_batches, pad_batch, rollouts

MIN_SHARED_PREFIX = 8
"""Below this many shared tokens, computing a prefix once is not worth a separate forward."""


def common_prefix(seqs: Sequence[TrainSequence]) -> int:
    """How many leading ids every member shares, stopping before any member's first sampled token.

    The shared prefix is context only: its own tokens get no logprob, so no loss. Completions
    of a group often begin with the same sampled tokens ("The capital of ...", the same first tool
    call); those are trained like any other sampled token, so they stay in each row's suffix.
    """
    first = seqs[0].input_ids
    n = min(len(s) for s in seqs) - 1  # at least one token of each row stays in the suffix
    n = min([n] + [s.sampled_mask.index(True) for s in seqs if True in s.sampled_mask])
    for s in seqs[1:]:
        ids = s.input_ids
        i = 0
        while i < n and ids[i] == first[i]:
            i += 1
        n = i
    return n


def row_cost(width: int, pair_cost: Fraction | float) -> Fraction | float:
    """The tokens of micro-batch budget one row of `width` positions costs: width + pair_cost width^2."""
    return width + pair_cost * width * width


def longest_row(budget: int, pair_cost: Fraction | float) -> int:
    """The widest row whose `row_cost` fits `budget` tokens (at least 1): `budget` without a pair cost.

    >>> longest_row(65536, 0), longest_row(65536, Fraction(16, 10452)), longest_row(100, Fraction(1, 10))
    (65536, 6224, 27)
    """
    if pair_cost <= 0:
        return budget
    width = int((math.sqrt(1 + 4 * float(pair_cost) * budget) - 1) / (2 * float(pair_cost)))
    while width > 1 and row_cost(width, pair_cost) > budget:  # the float root, made exact
        width -= 1
    while row_cost(width + 1, pair_cost) <= budget:
        width += 1
    return max(width, 1)


def chunks(seqs: Sequence[TrainSequence], per: int) -> list[list[TrainSequence]]:
    """`seqs` in order, cut into runs of at most `per` sequences that never cut a rollout: a rollout
    of more than `per` sequences is a run of its own.

    >>> from dataclasses import replace
    >>> one = TrainSequence([1, 2], [False, True], [0.0, -1.0], 1.0, 0, 1)
    >>> seqs = [replace(one, rollout=r) for r in (0, 1, 1, 2, 3, 3, 3)]
    >>> [[s.rollout for s in run] for run in chunks(seqs, 2)]
    [[0], [1, 1], [2], [3, 3, 3]]
    """
    out: list[list[TrainSequence]] = []
    for unit in rollouts(seqs):
        if not out or len(out[-1]) + len(unit) > per:
            out.append([])
        out[-1].extend(seqs[i] for i in unit)
    return out


def micro_batches(
    seqs: list[TrainSequence], opt: AdamWConfig, pad: int, *, pair_cost: Fraction | float = 0
) -> list[tuple[TrainBatch, int]]:
    """(batch, shared prefix length or 0) pairs of at most ~`micro_batch_tokens` tokens each,
    counting each row's attention as `pair_cost` tokens per pair of its positions.

    With `share_prefix`, each group's sequences go together so their prompt is computed once;
    sequences without a worthwhile common prefix are packed (or padded) as usual. A sequence wider
    than `longest_row` gets a micro-batch of its own (cutting it would drop sampled tokens), and the
    sequences of one rollout share a micro-batch (`chunks`, `pack_batches`).
    """
    if opt.micro_batch_tokens is None:
        raise ValueError(
            "optim.micro_batch_tokens is unset; set it, or resolve it from the free memory first "
            "(train.memory.auto_micro_batch_tokens, as the trainer does)"
        )
    budget = opt.micro_batch_tokens
    row = longest_row(budget, pair_cost)  # a packed row's widest, its attention counted
    out: list[tuple[TrainBatch, int]] = []
    rest: list[TrainSequence] = []
    if opt.share_prefix:
        by_group: dict[int, list[TrainSequence]] = {}
        for s in seqs:
            by_group.setdefault(s.group_id, []).append(s)
        for members in by_group.values():
            prefix = common_prefix(members) if len(members) > 1 else 0
            if prefix < MIN_SHARED_PREFIX:
                rest.extend(members)
                continue
            suffix = max(len(s) for s in members) - prefix
            per = max(1, (row - prefix) // max(suffix, 1))  # they run as one packed row of prefix + suffixes
            out.extend((pad_batch(run, pad_token_id=pad), prefix) for run in chunks(members, per))
    else:
        rest = list(seqs)
    if rest and opt.packing:
        out.extend((b, 0) for b in pack_batches(rest, row, pad_token_id=pad))
    elif rest:
        width = max(len(s) for s in rest)
        per = max(1, int(budget // row_cost(width, pair_cost)))
        out.extend((pad_batch(run, pad_token_id=pad), 0) for run in chunks(rest, per))
    return out
