"""Trajectories to training tensors: token in, token out, with an explicit sampled-token mask.

Nothing here tokenizes text. The sampler recorded, for every assistant turn, the exact context
ids it conditioned on and the ids it sampled; training uses those, because re-tokenizing decoded
text gives different ids in multi-turn tool use and breaks the logprob ratio.

A multi-turn trajectory becomes one sequence when the chat template is append-only (each turn's
prompt starts with the previous prompt + completion): the last prompt + last completion holds every
turn, and `sampled_mask` is True exactly on the tokens the policy sampled, never on the prompt or
on tool output and user text inserted between turns. A template that rewrites history (dropping
earlier `<think>` blocks, say) breaks the prefix; that turn starts a new sequence
(`prefix_breaks` counts them) instead of training on ids the policy never saw. The sequences of
one trajectory stay one rollout (`TrainSequence.rollout`): the loss normalises and takes GSPO's
ratio per rollout (`TrainBatch.rollout_ids`), whatever the number of sequences it was split into,
and micro-batches (`core.batching`) and data-parallel shards keep a rollout's sequences together.

Sequences are batched either padded (one per row, 2-D attention mask) or packed (several per row,
`position_ids` restarting at 0 and a 4-D block-diagonal causal mask, so packed sequences never
attend to each other on the sdpa / eager attention paths). Both carry per-token advantages and
`seq_ids`, so the losses in `grooves.core.loss` treat them the same.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from grooves.core.trajectory import SampledTurn, Trajectory


@dataclass(frozen=True)
class TrainSequence:
    """One training sequence: ids, which of them were sampled, and the sampler's logprobs there."""

    input_ids: list[int]
    sampled_mask: list[bool]
    """True on tokens the policy sampled; their loss is trained, everything else is context."""
    old_logprobs: list[float]
    """Sampling logprob of each sampled token, 0.0 elsewhere."""
    advantage: float
    group_id: int
    prompt_len: int
    """Length of the first turn's prompt: the part shared by the whole group."""
    temperatures: list[float] | None = None
    """Temperature of the distribution each token was sampled from (1.0 on tokens not sampled), so the
    trainer recomputes the same distribution; None: 1.0 everywhere. A turn's temperature is the one
    it was sampled at, not the run's: tasks may sample some turns at another temperature."""
    versions: list[int] | None = None
    """The adapter version that sampled each token (-1 on tokens not sampled or of a turn that
    records none); None: unknown everywhere. Truncated importance sampling with stale turns reads it."""
    rollout: int | None = field(default=None, compare=False)
    """Which rollout this sequence is part of: the sequences `trajectory_to_sequences` makes of one
    trajectory (several where its template broke the prefix) share one id, no other sequence has it,
    and the loss takes them as one sequence. None: a rollout of its own. An identity, not content:
    equal sequences of two rollouts are equal."""

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.sampled_mask) != n or len(self.old_logprobs) != n:
            raise ValueError(
                f"TrainSequence fields disagree: {n} input_ids, {len(self.sampled_mask)} mask entries, "
                f"{len(self.old_logprobs)} old_logprobs"
            )
        if self.temperatures is not None:
            if len(self.temperatures) != n:
                raise ValueError(
                    f"TrainSequence fields disagree: {n} input_ids, {len(self.temperatures)} temperatures"
                )
            if not all(0 < t < math.inf for t in self.temperatures):  # also refuses NaN
                raise ValueError(
                    "TrainSequence temperatures must be finite and > 0: a greedy turn (temperature 0) reports "
                    "its temperature-1 logprobs, so record 1.0 for its tokens"
                )
        if self.versions is not None and len(self.versions) != n:
            raise ValueError(f"TrainSequence fields disagree: {n} input_ids, {len(self.versions)} versions")

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_sampled(self) -> int:
        return sum(self.sampled_mask)


def check_mask_shape(turn: SampledTurn, index: int = 0) -> None:
    """Fail with a readable error if a turn's sampled ids and logprobs do not line up one to one."""
    if len(turn.token_ids) != len(turn.logprobs):
        raise ValueError(
            f"turn {index}: {len(turn.token_ids)} token_ids but {len(turn.logprobs)} logprobs; "
            "the sampler must return exactly one logprob per sampled token"
        )


def _segments(turns: Sequence[SampledTurn]) -> list[list[int]]:
    """Split turn indices into runs whose prompts extend the previous prompt + completion."""
    segments: list[list[int]] = []
    context: list[int] = []
    for i, turn in enumerate(turns):
        check_mask_shape(turn, i)
        extends = bool(segments) and turn.prompt_token_ids[: len(context)] == context
        if extends:
            segments[-1].append(i)
        else:
            segments.append([i])
        context = list(turn.prompt_token_ids) + list(turn.token_ids)
    return segments


_ROLLOUT_IDS = itertools.count()
"""Each `trajectory_to_sequences` call takes the next: unique among the sequences of a process."""


def rollouts(seqs: Sequence[TrainSequence]) -> list[list[int]]:
    """Indices into `seqs` grouped by rollout (`TrainSequence.rollout`), in order of first appearance.

    >>> a = TrainSequence([1, 2], [False, True], [0.0, -1.0], 1.0, 0, 1, rollout=7)
    >>> b = dataclasses.replace(a, rollout=None)
    >>> rollouts([a, b, a, b])
    [[0, 2], [1], [3]]
    """
    units: dict[object, list[int]] = {}
    for i, s in enumerate(seqs):
        units.setdefault(("own", i) if s.rollout is None else s.rollout, []).append(i)
    return list(units.values())


def prefix_breaks(traj: Trajectory) -> int:
    """How many turns of `traj` did not extend the previous context (non-append-only template)."""
    return max(len(_segments(traj.turns)) - 1, 0)


def logprob_temperature(turn: SampledTurn) -> float:
    """The temperature of the distribution a turn's logprobs were taken from: the turn's own, except
    a greedy turn (temperature 0), whose sampler reports temperature-1 logprobs (`policy/sampling.py`)."""
    return turn.temperature if turn.temperature > 0 else 1.0


def trajectory_to_sequences(traj: Trajectory, advantage: float, *, group_id: int = 0) -> list[TrainSequence]:
    """The training sequences of one trajectory: one if its template is append-only, else one per break.

    Within a sequence, each turn's new prompt tokens (tool output, user text, the template's
    role markers) are context (mask False) and its sampled tokens are trained (mask True, with
    their sampling logprobs and the temperature their turn was sampled at). The sequences share a
    `rollout` id of their own: however many they are, they are one rollout of the loss.
    """
    if traj.error is not None:
        raise ValueError(
            f"trajectory failed ({traj.error}); failed rollouts are not trained on, use group.ok"
        )
    rollout = next(_ROLLOUT_IDS)
    out = []
    for segment in _segments(traj.turns):
        first = traj.turns[segment[0]]
        ids: list[int] = []
        mask: list[bool] = []
        old: list[float] = []
        temps: list[float] = []
        versions: list[int] = []
        for i in segment:
            turn = traj.turns[i]
            new_context = turn.prompt_token_ids[len(ids) :]
            ids += list(new_context) + list(turn.token_ids)
            mask += [False] * len(new_context) + [True] * len(turn.token_ids)
            old += [0.0] * len(new_context) + [float(x) for x in turn.logprobs]
            temps += [1.0] * len(new_context) + [logprob_temperature(turn)] * len(turn.token_ids)
            version = -1 if turn.adapter_version is None else turn.adapter_version
            versions += [-1] * len(new_context) + [version] * len(turn.token_ids)
        out.append(
            TrainSequence(
                ids,
                mask,
                old,
                float(advantage),
                group_id,
                prompt_len=len(first.prompt_token_ids),
                temperatures=temps,
                versions=versions,
                rollout=rollout,
            )
        )
    return out


@dataclass(frozen=True)
class TrainBatch:
    """Tensors for one forward pass. Token t's logprob is predicted from position t - 1."""

    input_ids: torch.Tensor
    """[B, T] long."""
    attention_mask: torch.Tensor
    """[B, T] long (padded: 1 real, 0 pad) or [B, 1, T, T] float (packed: 0 allowed, finfo.min blocked)."""
    position_ids: torch.Tensor
    """[B, T] long, restarting at 0 for each packed sequence."""
    sampled_mask: torch.Tensor
    """[B, T] bool: token t was sampled by the policy and is trained."""
    old_logprobs: torch.Tensor
    """[B, T] float32 sampling logprobs, 0 where not sampled."""
    temperatures: torch.Tensor
    """[B, T] float32: token t's logprob is read from log_softmax(logits[t - 1] / temperatures[t]); 1 where not sampled."""
    advantages: torch.Tensor
    """[B, T] float32 advantage of the sequence each token belongs to, 0 on padding."""
    seq_ids: torch.Tensor
    """[B, T] long: index of the token's sequence within this batch (0..num_sequences-1), -1 for padding."""
    num_sequences: int
    sequence_index: tuple[int, ...]
    """For each batch-local sequence id, its position in the list given to pad_batch / pack_batches."""
    versions: torch.Tensor | None = None
    """[B, T] long: the adapter version that sampled token t, -1 where not sampled or not recorded."""
    rollout_ids: torch.Tensor | None = None
    """[B, T] long: index of the token's rollout within this batch (0..), -1 for padding; the loss's
    sequences (`core.loss`), where the sequences of a rollout split at a prefix break are one.
    None: `seq_ids` (every sequence a rollout of its own)."""

    def __post_init__(self) -> None:
        if self.versions is None:
            object.__setattr__(self, "versions", torch.full_like(self.input_ids, -1))
        if self.rollout_ids is None:
            object.__setattr__(self, "rollout_ids", self.seq_ids.clone())

    @property
    def num_sampled_tokens(self) -> int:
        return int(self.sampled_mask.sum())

    def to(self, device: torch.device | str) -> TrainBatch:
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)


def pad_batch(seqs: Sequence[TrainSequence], *, pad_token_id: int = 0) -> TrainBatch:
    """One sequence per row, right-padded, with a 2-D attention mask."""
    return _assemble([[i] for i in range(len(seqs))], seqs, pad_token_id, packed=False)


def pack_batches(
    seqs: Sequence[TrainSequence], max_tokens: int, *, rows_per_batch: int = 1, pad_token_id: int = 0
) -> list[TrainBatch]:
    """Pack sequences into rows of at most `max_tokens` tokens, `rows_per_batch` rows per batch.

    First-fit decreasing by length, so rows come out nearly full. The unit packed is a rollout
    (`rollouts`): its sequences go into one row, or, when together they are longer than
    `max_tokens`, into rows of their own in one batch (more rows than `rows_per_batch` if need be),
    so the loss sees every rollout whole. A sequence longer than `max_tokens` gets a row of its own
    rather than being cut (cutting would drop sampled tokens). Every batch has a 4-D block-diagonal
    causal mask [B, 1, T, T]; padding attends to itself only.
    """
    if max_tokens < 1 or rows_per_batch < 1:
        raise ValueError(f"max_tokens and rows_per_batch must be >= 1, got {max_tokens} and {rows_per_batch}")
    units = rollouts(seqs)
    size = [sum(len(seqs[i]) for i in unit) for unit in units]
    rows: list[list[int]] = []
    room: list[int] = []
    blocks: list[list[int]] = []  # rows that go into one batch
    for u in sorted(range(len(units)), key=lambda u: -size[u]):
        unit, n = units[u], size[u]
        if n > max_tokens and len(unit) > 1:  # a rollout too long for one row: a row per sequence
            blocks.append(list(range(len(rows), len(rows) + len(unit))))
            rows.extend([i] for i in unit)
            room.extend(max_tokens - len(seqs[i]) for i in unit)
            continue
        slot = next((r for r, free in enumerate(room) if free >= n), None)
        if slot is None:
            blocks.append([len(rows)])
            rows.append(list(unit))
            room.append(max_tokens - n)
        else:
            rows[slot].extend(unit)
            room[slot] -= n
    batches: list[list[list[int]]] = []
    for block in blocks:
        if not batches or len(batches[-1]) + len(block) > rows_per_batch:
            batches.append([])
        batches[-1].extend(rows[r] for r in block)
    return [_assemble(batch, seqs, pad_token_id, packed=True) for batch in batches]


def _assemble(
    rows: list[list[int]], seqs: Sequence[TrainSequence], pad_token_id: int, *, packed: bool
) -> TrainBatch:
    """Lay out `rows` (lists of indices into `seqs`) as right-padded [B, T] tensors."""
    width = max((sum(len(seqs[i]) for i in row) for row in rows), default=0)
    shape = (len(rows), width)
    input_ids = torch.full(shape, pad_token_id, dtype=torch.long)  # [B, T]
    position_ids = torch.zeros(shape, dtype=torch.long)  # [B, T]
    sampled = torch.zeros(shape, dtype=torch.bool)  # [B, T]
    old = torch.zeros(shape, dtype=torch.float32)  # [B, T]
    temps = torch.ones(shape, dtype=torch.float32)  # [B, T]
    adv = torch.zeros(shape, dtype=torch.float32)  # [B, T]
    seq_ids = torch.full(shape, -1, dtype=torch.long)  # [B, T]
    versions = torch.full(shape, -1, dtype=torch.long)  # [B, T]
    rollout_ids = torch.full(shape, -1, dtype=torch.long)  # [B, T]
    rollout_of = {
        i: r for r, unit in enumerate(rollouts([seqs[i] for row in rows for i in row])) for i in unit
    }
    index: list[int] = []
    for b, row in enumerate(rows):
        start = 0
        for i in row:
            s, n = seqs[i], len(seqs[i])
            span = slice(start, start + n)
            input_ids[b, span] = torch.tensor(s.input_ids, dtype=torch.long)
            position_ids[b, span] = torch.arange(n)
            sampled[b, span] = torch.tensor(s.sampled_mask, dtype=torch.bool)
            old[b, span] = torch.tensor(s.old_logprobs, dtype=torch.float32)
            if s.temperatures is not None:
                temps[b, span] = torch.tensor(s.temperatures, dtype=torch.float32)
            adv[b, span] = s.advantage
            if s.versions is not None:
                versions[b, span] = torch.tensor(s.versions, dtype=torch.long)
            seq_ids[b, span] = len(index)
            rollout_ids[b, span] = rollout_of[len(index)]
            index.append(i)
            start += n
        if not packed:
            position_ids[b, start:] = torch.arange(start, width)
    attention_mask = block_causal_mask(seq_ids) if packed else (seq_ids >= 0).long()
    return TrainBatch(
        input_ids,
        attention_mask,
        position_ids,
        sampled,
        old,
        temps,
        adv,
        seq_ids,
        len(index),
        tuple(index),
        versions,
        rollout_ids,
    )


def block_causal_mask(seq_ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive 4-D mask [B, 1, T, T] from seq_ids [B, T]: 0 where query i may see key j, finfo.min elsewhere.

    i sees j when both are in the same sequence and j <= i; a padding position sees only itself,
    so no softmax row is empty (an empty row would give NaN).
    """
    t = seq_ids.shape[-1]
    same = (seq_ids[:, :, None] == seq_ids[:, None, :]) & (seq_ids[:, :, None] >= 0)  # [B, T, T]
    causal = torch.ones(t, t, dtype=torch.bool, device=seq_ids.device).tril()  # [T, T]
    eye = torch.eye(t, dtype=torch.bool, device=seq_ids.device)  # [T, T]
    allowed = (same & causal) | eye  # [B, T, T]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=seq_ids.device)  # [B, T, T]
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]  # [B, 1, T, T]
