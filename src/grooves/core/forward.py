"""Per-token logprobs and entropies of a causal LM on a `TrainBatch`, padded or packed.

The logprob of token t is read from the distribution at position t - 1, under the temperature
that token was sampled at (logits / T_t, from `TrainBatch.temperatures`: a task may sample each
turn at its own temperature), so it is comparable with the sampler's logprobs. The
model's logits are computed once; the float32 log-softmax over the vocabulary is done a chunk of
positions at a time and, when gradients are on, recomputed in the backward pass
(activation checkpointing) instead of kept, so the full [B, T, V] float32 log-softmax never exists.

The same function gives reference logprobs: the caller wraps it in `model.disable_adapter()` (a
peft model) and `torch.no_grad()`; nothing here knows about adapters.
"""

from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint

from grooves.core.tokenize import TrainBatch

_MASKED_ATTENTION = ("sdpa", "eager")
"""Attention implementations that honour a custom 4-D additive mask (packed batches)."""


def token_logprobs(
    model: torch.nn.Module, batch: TrainBatch, temperature: float | None = None, *, chunk_size: int = 512
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of each token under `model`, and the entropy of the distribution that predicted it.

    Returns (lp [B, T] float32, with grad if enabled; entropy [B, T] float32, detached).
    lp[:, t] = log softmax(logits[:, t - 1] / T_t)[input_ids[:, t]], with T_t = batch.temperatures[:, t]
    (the temperature token t was sampled at), or `temperature` for every token when given;
    entropy[:, t] = -sum_v p_v log p_v of that same distribution. Both are 0 at the first
    position of every sequence (nothing predicts it; it is never a sampled token).
    """
    embed = model.get_input_embeddings().weight
    batch = batch.to(embed.device)
    temps = _token_temperatures(batch, temperature)  # [B, T] or None (1 everywhere)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=_attention_mask(model, batch.attention_mask, embed.dtype),
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits  # [B, T, V]
    predicting = logits[:, :-1]  # [B, T-1, V]: position t-1 predicts token t
    targets = batch.input_ids[:, 1:]  # [B, T-1]
    lp, entropy = _logprobs_of(predicting, targets, _from(temps, 1), chunk_size, lead=1)  # [B, T]
    starts = (
        batch.position_ids == 0
    )  # [B, T]: a packed row's next sequence is not predicted by the previous one
    return lp.masked_fill(starts, 0.0), entropy.masked_fill(starts, 0.0)


def _token_temperatures(batch: TrainBatch, temperature: float | None) -> torch.Tensor | None:
    """Each token's temperature [B, T] (`temperature` for all when given), or None when all are 1:
    then the logits need no division."""
    if temperature is not None:
        if not 0 < temperature < math.inf:
            raise ValueError(
                f"temperature must be finite and > 0, got {temperature}; use the sampler's temperature"
            )
        return None if temperature == 1.0 else torch.full_like(batch.old_logprobs, temperature)
    temps = batch.temperatures  # [B, T]
    return None if bool((temps == 1.0).all()) else temps


def _from(temps: torch.Tensor | None, start: int) -> torch.Tensor | None:
    return None if temps is None else temps[:, start:]


def _logprobs_of(
    predicting: torch.Tensor, targets: torch.Tensor, temps: torch.Tensor | None, chunk_size: int, lead: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs/entropies of `targets` [B, S] under `predicting` [B, S, V] / `temps` [B, S] (None: 1),
    chunked over S, with `lead` zero columns in front (positions nothing here predicts)."""
    lp_parts, ent_parts = [], []
    for start in range(0, targets.shape[1], chunk_size):
        chunk = predicting[:, start : start + chunk_size]  # [B, c, V]
        tgt = targets[:, start : start + chunk_size]  # [B, c]
        temp = None if temps is None else temps[:, start : start + chunk_size]  # [B, c]
        if torch.is_grad_enabled() and chunk.requires_grad:
            lp_c, ent_c = checkpoint(_chunk_logprobs, chunk, tgt, temp, use_reentrant=False)
        else:
            lp_c, ent_c = _chunk_logprobs(chunk, tgt, temp)
        lp_parts.append(lp_c)
        ent_parts.append(ent_c)
    zeros = torch.zeros(targets.shape[0], lead, dtype=torch.float32, device=targets.device)  # [B, lead]
    return torch.cat([zeros, *lp_parts], dim=1), torch.cat([zeros, *ent_parts], dim=1)


def shared_prefix_logprobs(
    model: torch.nn.Module,
    batch: TrainBatch,
    prefix_len: int,
    temperature: float | None = None,
    *,
    chunk_size: int = 512,
    pack_suffixes: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`token_logprobs` for a padded batch whose rows all start with the same `prefix_len` tokens
    (a GRPO group's prompt), computing that prefix once instead of once per row. The prefix must end
    before every row's first sampled token: its positions come back as 0 (`ValueError` otherwise).

    With sdpa / eager attention the prefix and the rows' suffixes, without their padding, run as
    one packed [1, P + N] row under a mask that lets each suffix token see the whole prefix and
    the earlier tokens of its own row: P + N tokens of compute instead of B T (padding a group to
    its longest completion wastes a quarter of the tokens in a typical GRPO step), in one forward
    (a separate prefix forward would stream every weight once more, at a poor matmul rate for its
    few rows), and the output head runs only on the N + 1 positions that predict a sampled token.
    Other attention implementations (flash attention takes no 4-D mask) run the prefix once, repeat
    its KV cache for the B rows and run the padded [B, T - P] suffixes on it (`pack_suffixes`
    forces one way). Gradients flow through the shared prefix, so the LoRA
    weights get exactly the gradient of B separate full forwards. Returns lp and entropy [B, T]
    in the same layout as `token_logprobs` (0 on prefix positions, which are never sampled; values
    on padding are meaningless, as there).
    """
    if batch.attention_mask.ndim != 2:
        raise ValueError("shared_prefix_logprobs needs a padded batch (pad_batch), not a packed one")
    rows, width = batch.input_ids.shape
    if not 0 < prefix_len < width:
        raise ValueError(f"prefix_len must be in 1..{width - 1}, got {prefix_len}")
    embed = model.get_input_embeddings().weight
    batch = batch.to(embed.device)
    prefix = batch.input_ids[:1, :prefix_len]  # [1, P]
    if not bool((batch.input_ids[:, :prefix_len] == prefix).all()):
        raise ValueError("rows of the batch do not share their first prefix_len tokens")
    if bool(batch.sampled_mask[:, :prefix_len].any()):
        raise ValueError(
            "the shared prefix holds sampled tokens; it must end before every row's first sampled token"
        )
    temps = _token_temperatures(batch, temperature)  # [B, T] or None
    if pack_suffixes is None:
        pack_suffixes = getattr(model.config, "_attn_implementation", None) in _MASKED_ATTENTION
    if pack_suffixes:
        return _packed_with_prefix(model, batch, prefix_len, temps, chunk_size)
    head = model(
        input_ids=prefix, use_cache=True, logits_to_keep=1
    )  # only the last prefix position predicts a sampled token
    cache = head.past_key_values
    cache.batch_repeat_interleave(rows)  # [1, ...] -> [B, ...], differentiable
    suffix = batch.input_ids[:, prefix_len:]  # [B, S]
    mask = torch.cat(
        [batch.attention_mask.new_ones(rows, prefix_len), batch.attention_mask[:, prefix_len:]], dim=1
    )
    positions = torch.arange(prefix_len, width, device=suffix.device).expand(rows, -1)  # [B, S]
    tail = model(
        input_ids=suffix, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
    )
    predicting = torch.cat(
        [head.logits[:, -1:].expand(rows, -1, -1), tail.logits[:, :-1]], dim=1
    )  # [B, S, V]
    return _logprobs_of(predicting, suffix, _from(temps, prefix_len), chunk_size, lead=prefix_len)


def _packed_with_prefix(
    model, batch: TrainBatch, prefix_len: int, temps: torch.Tensor | None, chunk_size: int
):
    """The prefix and then every row's suffix as one packed [1, P + N] row; lp and entropy back in [B, T]."""
    rows, width = batch.input_ids.shape
    device = batch.input_ids.device
    p = prefix_len
    real = batch.attention_mask[:, p:].bool()  # [B, S]: right padding is False
    suffix = batch.input_ids[:, p:]  # [B, S]
    ids = suffix[real]  # [N], row after row
    n = ids.shape[0]
    seq = torch.arange(rows, device=device).repeat_interleave(
        real.sum(-1)
    )  # [N]: the row of each packed token
    offset = torch.arange(suffix.shape[1], device=device).expand(rows, -1)[real]  # [N]: its place in the row
    index = torch.arange(n, device=device)
    allowed = torch.zeros(p + n, p + n, dtype=torch.bool, device=device)
    allowed[:p, :p] = torch.ones(p, p, dtype=torch.bool, device=device).tril()  # the prefix is causal
    allowed[p:, :p] = True  # every suffix token sees the whole prefix
    allowed[p:, p:] = (seq[:, None] == seq[None, :]) & (
        index[None, :] <= index[:, None]
    )  # and its own row, causally
    dtype = model.get_input_embeddings().weight.dtype
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )
    out = model(
        input_ids=torch.cat([batch.input_ids[0, :p], ids])[None],
        attention_mask=mask[None, None],
        position_ids=torch.cat([torch.arange(p, device=device), p + offset])[None],
        use_cache=False,
        logits_to_keep=kept_positions(
            p - 1, p + n, device
        ),  # the prefix's earlier positions predict nothing sampled
    )
    kept = out.logits  # [1, N + 1, V]; kept[:, k] is packed position P - 1 + k
    # packed token k is predicted by the position before it (kept[:, k]), except a row's first
    # token: the prefix's last position (kept[:, 0]); both are read as views, never copied
    suffix_temps = _from(temps, p)  # [B, S] or None
    packed_temps = None if suffix_temps is None else suffix_temps[real][None]  # [1, N]
    first_temps = None if suffix_temps is None else suffix_temps[:, :1]  # [B, 1]
    lp_next, ent_next = _logprobs_of(kept[:, :n], ids[None], packed_temps, chunk_size, lead=0)  # [1, N]
    lp_first, ent_first = _logprobs_of(
        kept[:, :1].expand(rows, -1, -1), suffix[:, :1], first_temps, chunk_size, lead=0
    )  # [B, 1]
    first = offset == 0  # [N]
    lp = torch.where(first, lp_first[seq, 0], lp_next[0])  # [N]
    entropy = torch.where(first, ent_first[seq, 0], ent_next[0])  # [N]
    placed = torch.cat([real.new_zeros(rows, p), real], dim=1)  # [B, T]
    return lp.new_zeros(rows, width).masked_scatter(placed, lp), entropy.new_zeros(
        rows, width
    ).masked_scatter(placed, entropy)


def kept_positions(start: int, stop: int, device: torch.device | str) -> torch.Tensor:
    """`logits_to_keep` for positions start .. stop - 1 of every row, as an index tensor.

    Not the int form: its slice of the hidden states is a view whose batch stride makes torch's
    matmul run the output head as a batched matmul (at about half the rate of a plain one, and
    one pass over the head's weight per row when each row keeps one position); the indexed copy
    is contiguous and runs as one plain matmul.
    """
    return torch.arange(start, stop, device=device)


def _chunk_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temps: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    scaled = logits.float() if temps is None else logits.float() / temps[..., None]  # [B, c, V]
    logp = torch.log_softmax(scaled, dim=-1)  # [B, c, V]
    lp = logp.gather(-1, targets[..., None]).squeeze(-1)  # [B, c]
    with (
        torch.no_grad()
    ):  # -sum p log p from the log-probabilities at hand: no second log over the vocabulary
        entropy = -(logp.exp() * logp).sum(-1)  # [B, c]; logits are finite, so no 0 * -inf
    return lp, entropy


def _attention_mask(model: torch.nn.Module, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A 2-D padding mask as is; a 4-D additive mask in the model's dtype, checked against its attention."""
    if mask.ndim != 4:
        return mask
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in _MASKED_ATTENTION:
        raise ValueError(
            f"packed batches need attn_implementation in {_MASKED_ATTENTION} (a 4-D mask), but the model "
            f"uses {impl!r}; load it with attn_implementation='sdpa' or use pad_batch"
        )
    if mask.dtype == dtype:
        return mask
    blocked = mask < 0  # [B, 1, T, T]
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        blocked, torch.finfo(dtype).min
    )
