"""The optimizer both trainers (RL and SFT) use: AdamW on the trainable (LoRA) parameters."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def adamw(
    params: Iterable[torch.nn.Parameter], *, lr: float, betas: tuple[float, float], weight_decay: float
) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter, 2019) with torch's fused kernel where every parameter allows it.

    A LoRA adapter is hundreds of small tensors; the default (per-tensor) implementation on CPU
    spends its time in Python and op dispatch. The fused kernel computes the same update in one
    call per step. It covers floating-point tensors on CPU and CUDA; anything else gets the default
    implementation.
    """
    params = list(params)
    if not params:
        raise ValueError(
            "no trainable parameters: the model has no LoRA adapter to train (check the lora section)"
        )
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None)
