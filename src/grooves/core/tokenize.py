"""Trajectories to training tensors: token in, token out, with an explicit sampled-token mask.

Nothing here tokenizes text. The sampler recorded, for every assistant turn, the exact context
ids it conditioned on and the ids it sampled; training uses those, because re-tokenizing decoded
text gives different ids in multi-turn tool use and breaks the logprob ratio.

A multi-turn trajectory becomes one sequence when the chat template is append-only (each turn's
prompt starts with the previous prompt + completion): the last prompt + last completion holds every
turn, and `sampled_mask` is True exactly on the tokens the policy sampled, never on the prompt or
on tool output and user text inserted between turns. A template that rewrites history (dropping
earlier `<think>` blocks, say) breaks the prefix; that turn starts a new sequence
(`prefix_breaks` counts them) instead of training on ids the policy never saw.

Sequences are batched either padded (one per row, 2-D attention mask) or packed (several per row,
`position_ids` restarting at 0 and a 4-D block-diagonal causal mask, so packed sequences never
attend to each other on the sdpa / eager attention paths). Both carry per-token advantages and
`seq_ids`, so the losses in `grooves.core.loss` treat them the same.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

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
    their sampling logprobs and the temperature their turn was sampled at).
    """
    if traj.error is not None:
        raise ValueError(
            f"trajectory failed ({traj.error}); failed rollouts are not trained on, use group.ok"
        )
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

    def __post_init__(self) -> None:
        if self.versions is None:
            object.__setattr__(self, "versions", torch.full_like(self.input_ids, -1))

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

    First-fit decreasing by length, so rows come out nearly full. A sequence longer than
    `max_tokens` gets a row of its own rather than being cut (cutting would drop sampled tokens).
    Every batch has a 4-D block-diagonal causal mask [B, 1, T, T]; padding attends to itself only.
    """
    if max_tokens < 1 or rows_per_batch < 1:
        raise ValueError(f"max_tokens and rows_per_batch must be >= 1, got {max_tokens} and {rows_per_batch}")
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = len(seqs[i])
        slot = next((r for r, free in enumerate(room) if free >= n), None)
        if slot is None:
            rows.append([i])
            room.append(max_tokens - n)
        else:
            rows[slot].append(i)
            room[slot] -= n
    return [
        _assemble(rows[k : k + rows_per_batch], seqs, pad_token_id, packed=True)
        for k in range(0, len(rows), rows_per_batch)
    ]


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
