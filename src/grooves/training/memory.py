"""How many tokens a training micro-batch may hold, from the device's free memory (`optim.micro_batch_tokens` unset).

A step's forward and backward keep, for every token of a micro-batch, the activations the
backward needs. For a Llama-style decoder (L layers, width H, MLP width I, vocabulary V,
activations of b bytes) that is about

    per layer:   (10 H + 4 I) b    the norms' outputs, q/k/v, attention and o_proj inputs, the
                                   residual, the MLP's gate, up, activation and product
    output head: V (2 b + 4)       the logits, their gradient, and the float32 log-softmax of a
                                   chunk of positions (`core.forward`)

so `bytes_per_token = L (10 H + 4 I) b + V (2 b + 4)`. With gradient checkpointing a layer keeps
only its input, H b, and one layer's intermediates exist at a time while it is recomputed:
`L H b + (10 H + 4 I) b + V (2 b + 4)`. The LoRA adapter's own activations (rank r per adapted
layer) are small beside these and ride on the margin.

Attention adds a term per pair of positions of a row, which grows as T x T: a micro-batch of rows
of width T holds `T bytes_per_token + T^2 bytes_per_pair` for each row (`bytes_per_pair`). With
the sdpa attention grooves loads, torch's fused kernels (flash attention on CPU, memory-efficient
attention on CUDA) keep no [heads, T, T] matrix; what remains is the mask: a packed row's float32
additive mask [1, 1, T, T] is kept for the backward and is built from boolean masks of the same
shape (`core.tokenize.block_causal_mask`), and a padded batch's mask is transformers' own.
`MASK_BYTES` covers both. Eager attention also keeps each layer's attention probabilities,
heads x T x T, and makes its scores of the same size while it computes them. `pair_tokens` is
the ratio of the two terms, the tokens one pair costs, which `core.batching.micro_batches` adds
to each row's width when it fills a micro-batch; one row is then at most
`core.batching.longest_row` tokens wide.

The budget is half of the memory free once the model has loaded (the other half is margin for
the allocator's fragmentation, the optimizer's state, and what the estimate leaves out); the
count is rounded down to a power of two, so that small changes in free memory rarely change it,
and kept within [256, 65536]. On a GPU "free" is `torch.cuda.mem_get_info`; on a CPU it is the
kernel's MemAvailable.
"""

from __future__ import annotations

import os
from fractions import Fraction
from typing import Any

MIN_TOKENS = 256
MAX_TOKENS = 65_536
BUDGET_SHARE = 0.5
"""Of the free memory, the share micro-batch activations may use."""
MASK_BYTES = 16
"""Bytes per pair of positions of a row for its attention mask under sdpa. Measured on the tiny
test Llama: autograd keeps 4 (a packed row's float32 mask) to 8 (a padded batch's) bytes a pair;
building a packed row's mask peaks at 13 by count (`block_causal_mask`: the float32 mask, the
float32 zeros it is filled from, and five boolean masks) and at 14.6 by the process's peak memory
(rows of 8,192 and 12,288 tokens)."""


def bytes_per_token(
    *, layers: int, hidden: int, intermediate: int, vocab: int, dtype_bytes: int, checkpointing: bool
) -> int:
    """The activation bytes one training token holds at the peak of a backward (module docstring).

    SmolLM2-135M (30 layers, 576 wide, MLP 1536, vocabulary 49152) in float32: 30 (10 x 576 +
    4 x 1536) 4 + 49152 (2 x 4 + 4) = 1,428,480 + 589,824 bytes:

    >>> bytes_per_token(layers=30, hidden=576, intermediate=1536, vocab=49152, dtype_bytes=4, checkpointing=False)
    2018304
    >>> bytes_per_token(layers=30, hidden=576, intermediate=1536, vocab=49152, dtype_bytes=4, checkpointing=True)
    706560
    """
    per_layer = (10 * hidden + 4 * intermediate) * dtype_bytes
    head = vocab * (2 * dtype_bytes + 4)
    if checkpointing:
        return layers * hidden * dtype_bytes + per_layer + head
    return layers * per_layer + head


def bytes_per_pair(*, layers: int, heads: int, dtype_bytes: int, checkpointing: bool, attention: str) -> int:
    """The bytes one pair of positions of a row holds at the peak of a backward (module docstring):
    the mask's `MASK_BYTES`, and with eager attention each kept layer's probabilities (every layer,
    or one with checkpointing) and one layer's scores, heads x b each.

    SmolLM2-135M (30 layers, 9 heads) in float32: 16 with sdpa; 16 + (30 + 1) x 9 x 4 = 1132 eager:

    >>> bytes_per_pair(layers=30, heads=9, dtype_bytes=4, checkpointing=False, attention="sdpa")
    16
    >>> bytes_per_pair(layers=30, heads=9, dtype_bytes=4, checkpointing=False, attention="eager")
    1132
    """
    if attention != "eager":
        return MASK_BYTES
    kept = 1 if checkpointing else layers
    return MASK_BYTES + (kept + 1) * heads * dtype_bytes


def tokens_for(free_bytes: int, per_token: int) -> int:
    """`BUDGET_SHARE` of `free_bytes` / `per_token`, rounded down to a power of two, within [256, 65536].

    >>> tokens_for(12 * 2**30, 2018304)    # 12 GiB free: 3192 tokens fit, 2048 is the power of two below
    2048
    >>> tokens_for(2**20, 2018304), tokens_for(2**40, 1000)
    (256, 65536)
    """
    fit = int(free_bytes * BUDGET_SHARE) // max(per_token, 1)
    if fit < MIN_TOKENS:
        return MIN_TOKENS
    return min(MAX_TOKENS, 1 << (fit.bit_length() - 1))


def free_memory(device: str) -> int:
    """Bytes free on `device`: the CUDA driver's figure for a GPU, MemAvailable for the CPU."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def auto_micro_batch_tokens(model: Any, device: str, *, checkpointing: bool, free: int | None = None) -> int:
    """The micro-batch size for `model` (a transformers model, peft-wrapped or not) on `device`."""
    per_token = bytes_per_token(**_shape(model), checkpointing=checkpointing)
    return tokens_for(free_memory(device) if free is None else free, per_token)


def pair_tokens(model: Any, *, checkpointing: bool) -> Fraction:
    """The tokens of micro-batch budget one pair of positions of a row costs for `model`:
    `bytes_per_pair / bytes_per_token` (module docstring), exact."""
    shape = _shape(model)
    per_token = bytes_per_token(**shape, checkpointing=checkpointing)
    per_pair = bytes_per_pair(
        layers=shape["layers"],
        heads=int(model.config.num_attention_heads),
        dtype_bytes=shape["dtype_bytes"],
        checkpointing=checkpointing,
        attention=str(getattr(model.config, "_attn_implementation", None) or "eager"),
    )
    return Fraction(per_pair, per_token)


def _shape(model: Any) -> dict[str, int]:
    config = model.config
    hidden = int(config.hidden_size)
    return {
        "layers": int(config.num_hidden_layers),
        "hidden": hidden,
        "intermediate": int(getattr(config, "intermediate_size", None) or 4 * hidden),
        "vocab": int(config.vocab_size),
        # the activations' dtype, not the adapter's
        "dtype_bytes": model.get_input_embeddings().weight.element_size(),
    }
