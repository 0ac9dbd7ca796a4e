"""Per-token logprobs and entropies of a causal LM on a `TrainBatch`, padded or packed.

The logprob of token t is read from the distribution at position t - 1, under the same
temperature the sampler used (logits / T), so it is comparable with the sampler's logprobs. The
model's logits are computed once; the float32 log-softmax over the vocabulary is done a chunk of
positions at a time and, when gradients are on, recomputed in the backward pass
(activation checkpointing) instead of kept, so the full [B, T, V] float32 log-softmax never exists.

The same function gives reference logprobs: the caller wraps it in `model.disable_adapter()` (a
peft model) and `torch.no_grad()`; nothing here knows about adapters.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from grooves.tokenize import TrainBatch

_MASKED_ATTENTION = ("sdpa", "eager")
"""Attention implementations that honour a custom 4-D additive mask (packed batches)."""


def token_logprobs(
    model: torch.nn.Module, batch: TrainBatch, temperature: float = 1.0, *, chunk_size: int = 512
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of each token under `model`, and the entropy of the distribution that predicted it.

    Returns (lp [B, T] float32, with grad if enabled; entropy [B, T] float32, detached).
    lp[:, t] = log softmax(logits[:, t - 1] / temperature)[input_ids[:, t]];
    entropy[:, t] = -sum_v p_v log p_v of that same distribution. Both are 0 at the first
    position of every sequence (nothing predicts it; it is never a sampled token).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}; use the sampler's temperature")
    embed = model.get_input_embeddings().weight
    batch = batch.to(embed.device)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=_attention_mask(model, batch.attention_mask, embed.dtype),
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits  # [B, T, V]
    predicting = logits[:, :-1]  # [B, T-1, V]: position t-1 predicts token t
    targets = batch.input_ids[:, 1:]  # [B, T-1]
    lp_parts, ent_parts = [], []
    for start in range(0, targets.shape[1], chunk_size):
        chunk = predicting[:, start : start + chunk_size]  # [B, c, V]
        tgt = targets[:, start : start + chunk_size]  # [B, c]
        if torch.is_grad_enabled() and chunk.requires_grad:
            lp_c, ent_c = checkpoint(_chunk_logprobs, chunk, tgt, temperature, use_reentrant=False)
        else:
            lp_c, ent_c = _chunk_logprobs(chunk, tgt, temperature)
        lp_parts.append(lp_c)
        ent_parts.append(ent_c)
    zeros = torch.zeros(logits.shape[0], 1, dtype=torch.float32, device=logits.device)  # [B, 1]
    lp = torch.cat([zeros, *lp_parts], dim=1)  # [B, T]
    entropy = torch.cat([zeros, *ent_parts], dim=1)  # [B, T]
    starts = batch.position_ids == 0  # [B, T]: a packed row's next sequence is not predicted by the previous one
    return lp.masked_fill(starts, 0.0), entropy.masked_fill(starts, 0.0)


def _chunk_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, c, V]
    lp = logp.gather(-1, targets[..., None]).squeeze(-1)  # [B, c]
    with torch.no_grad():
        entropy = torch.special.entr(logp.exp()).sum(-1)  # [B, c]
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
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(blocked, torch.finfo(dtype).min)
