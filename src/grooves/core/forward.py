"""Per-token logprobs and entropies of a causal LM on a `TrainBatch`, padded or packed.

The logprob of token t is read from the distribution at position t - 1, under the temperature
that token was sampled at (logits / T_t, from `TrainBatch.temperatures`: a task may sample each
turn at its own temperature), so it is comparable with the sampler's logprobs. The
model's logits are computed once; `target_logprobs` reads each sampled token's logprob and its
distribution's entropy from them (a log-sum-exp a chunk of positions at a time) and writes their
gradient in one pass, `g (onehot - softmax) / T`, so no [B, T, V] log-softmax, its gradient or a
zero-filled gradient of a slice of the logits is ever made.

The same function gives reference logprobs: the caller wraps it in `model.disable_adapter()` (a
peft model) and `torch.no_grad()`; nothing here knows about adapters.
"""

from __future__ import annotations

import math

import torch

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
    # a transformers model's method (nn.Module's attribute lookup is typed Tensor | Module)
    embed = model.get_input_embeddings().weight  # type: ignore[operator]
    batch = batch.to(embed.device)
    temps = _token_temperatures(batch, temperature)  # [B, T] or None (1 everywhere)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=_attention_mask(model, batch.attention_mask, embed.dtype),
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits  # [B, T, V]
    rows, width, vocab = logits.shape
    # position t - 1 of row b, flat row b T + t - 1 of the logits (a view), predicts token t
    steps = torch.arange(width - 1, device=logits.device)
    pred = (torch.arange(rows, device=logits.device)[:, None] * width + steps).reshape(-1)  # [B (T-1)]
    targets = batch.input_ids[:, 1:].reshape(-1)  # [B (T-1)]
    token_temps = None if temps is None else temps[:, 1:].reshape(-1)
    lp, entropy = target_logprobs(logits.reshape(rows * width, vocab), pred, targets, token_temps, chunk_size)
    lp, entropy = (_lead(x.view(rows, width - 1), 1) for x in (lp, entropy))  # [B, T]
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


def _lead(x: torch.Tensor, lead: int) -> torch.Tensor:
    """[B, S] -> [B, lead + S] with `lead` zero columns in front (positions nothing here predicts)."""
    return torch.cat([x.new_zeros(x.shape[0], lead), x], dim=1)


def target_logprobs(
    logits: torch.Tensor,
    pred: torch.Tensor,
    targets: torch.Tensor,
    temps: torch.Tensor | None = None,
    chunk_size: int = 512,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob and entropy of K tokens, token k predicted by row pred[k] of `logits` [M, V].

    lp[k] = z[p, y] - logsumexp(z[p]) with p = pred[k], y = targets[k], z = logits / t_k
    (`temps` [K], None: 1), and entropy[k] = -sum_v softmax(z[p])_v log softmax(z[p])_v
    (detached), both float32 [K]. A row may predict several tokens (a shared prompt's last
    position predicts every completion's first token) and need not predict any. The backward
    writes dL/dz[p] = sum over the tokens k that p predicts of g_k (onehot(y_k) - softmax(z[p])) / t_k
    straight into the gradient of `logits`: one pass, no log-softmax or one-hot kept. Rows that
    predict tokens at two temperatures are read one row per token instead.
    """
    row_temps = None
    if temps is not None:
        row_temps = temps.new_ones(logits.shape[0]).index_put_((pred,), temps)
        if not torch.equal(row_temps[pred], temps):  # one row, two temperatures
            logits, row_temps = logits.index_select(0, pred), temps
            pred = torch.arange(len(targets), device=targets.device)
    return _TargetLogprobs.apply(logits, pred, targets, row_temps, chunk_size)


def _scaled(logits: torch.Tensor, temps: torch.Tensor | None) -> torch.Tensor:
    """float32 logits / each row's temperature (the logits themselves when float32 and all 1)."""
    return logits.float() if temps is None else logits.float() / temps[:, None]


def _logsumexp_and_entropy(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log sum_v exp(z_v) and -sum_v p_v log p_v (p = softmax(z)) of each row of z [c, V] float32; [c] each.

    Both are taken relative to the row max m: with s = z - m <= 0 and r the sum of exp(s) over all
    but the max, log Z = log1p(r), logsumexp = m + log Z, and the entropy is
    sum_v exp(s_v) (log Z - s_v) / (1 + r), every term a product of nonnegative numbers, so float32
    keeps its relative precision (1e-6 against float64 on rows of scale 100). `lse - sum p z`
    cancels two numbers near m (1e-3 off on peaked rows), and `z - logsumexp(z)` rounds the top
    token's log p (about -r) to float32's spacing near m (1e-5 absolute at 100).
    """
    top, at = z.max(dim=-1, keepdim=True)  # [c, 1]
    s = z - top  # [c, V]
    e = s.exp()  # [c, V]
    rest = e.scatter_(-1, at, 0.0).sum(-1, keepdim=True)  # [c, 1]: the max's own exp(0) = 1 set aside
    e.scatter_(-1, at, 1.0)
    log_z = torch.log1p(rest)  # [c, 1]
    entropy = s.neg_().add_(log_z).mul_(e).sum(-1) / (1.0 + rest.squeeze(-1))
    return (top + log_z).squeeze(-1), entropy


class _TargetLogprobs(torch.autograd.Function):
    """`target_logprobs` with its one-pass backward (see there)."""

    @staticmethod
    def forward(ctx, logits, pred, targets, row_temps, chunk_size):
        rows = logits.shape[0]
        lse = torch.empty(rows, dtype=torch.float32, device=logits.device)  # [M]
        entropy = torch.empty_like(lse)  # [M]
        for start in range(0, rows, chunk_size):
            part = slice(start, start + chunk_size)
            z = _scaled(logits[part], None if row_temps is None else row_temps[part])  # [c, V]
            lse[part], entropy[part] = _logsumexp_and_entropy(z)
        picked = logits[pred, targets].float()  # [K]
        if row_temps is not None:
            picked = picked / row_temps[pred]
        ctx.save_for_backward(logits, lse, pred, targets, row_temps)
        ctx.chunk_size = chunk_size
        token_entropy = entropy[pred]
        ctx.mark_non_differentiable(token_entropy)
        return picked - lse[pred], token_entropy

    @staticmethod
    def backward(ctx, grad_lp, _grad_entropy):
        logits, lse, pred, targets, row_temps = ctx.saved_tensors
        per_row = torch.zeros_like(lse).index_add_(0, pred, grad_lp)  # [M]: the sum of g_k over its tokens
        per_token = grad_lp
        if row_temps is not None:
            per_row = per_row / row_temps
            per_token = grad_lp / row_temps[pred]
        grad = torch.empty_like(logits)  # [M, V]
        rows = logits.shape[0]
        for start in range(0, rows, ctx.chunk_size):
            stop = min(start + ctx.chunk_size, rows)
            z = _scaled(logits[start:stop], None if row_temps is None else row_temps[start:stop])
            # float32 logits: written in place; others: summed in float32, then rounded once
            part = grad[start:stop] if grad.dtype == torch.float32 else torch.empty_like(z)
            torch.sub(z, lse[start:stop, None], out=part).exp_().mul_(
                -per_row[start:stop, None]
            )  # -G softmax / t
            here = (pred >= start) & (pred < stop)
            part.index_put_(
                (pred[here] - start, targets[here]), per_token[here], accumulate=True
            )  # + g onehot / t
            if grad.dtype != torch.float32:
                grad[start:stop] = part
        return grad, None, None, None, None


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
    # a transformers model's method (nn.Module's attribute lookup is typed Tensor | Module)
    embed = model.get_input_embeddings().weight  # type: ignore[operator]
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
    suffix_temps = _from(temps, prefix_len)
    lp, entropy = target_logprobs(
        predicting.reshape(-1, predicting.shape[-1]),
        torch.arange(suffix.numel(), device=suffix.device),
        suffix.reshape(-1),
        None if suffix_temps is None else suffix_temps.reshape(-1),
        chunk_size,
    )
    return _lead(lp.view(suffix.shape), prefix_len), _lead(entropy.view(suffix.shape), prefix_len)


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
    kept = out.logits.view(n + 1, -1)  # [N + 1, V]; row k is packed position P - 1 + k (a view:
    # indexing [0] would make its backward zero-fill a [1, N + 1, V] gradient)
    # packed token k is predicted by the position before it (row k), except a row's first token:
    # by the prefix's last position (row 0)
    pred = torch.where(offset == 0, torch.zeros_like(index), index)  # [N]
    suffix_temps = _from(temps, p)  # [B, S] or None
    lp, entropy = target_logprobs(
        kept, pred, ids, None if suffix_temps is None else suffix_temps[real], chunk_size
    )  # [N]
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
