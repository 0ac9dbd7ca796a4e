"""The optimizer both trainers (RL and SFT) use: AdamW on the trainable (LoRA) parameters, and its
learning-rate schedule (warmup, then constant, linear or cosine decay).

The schedule is a pure function of the step (`lr_factor`), applied through torch's `LambdaLR`. A
checkpoint needs nothing more than its step to continue it: `lr_scheduler(..., done=step)` puts the
scheduler where an uninterrupted run would be after `step` steps, so a resumed run uses the same
learning rate at every step as one that never stopped.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable

import torch

from grooves.config.optim import AdamWConfig


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


def lr_factor(done: int, *, schedule: str, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """The multiple of `optim.lr` the next optimizer step uses, after `done` steps (0-based).

    With W = `warmup_steps`, T = `total_steps`, m = `min_ratio`:

        warmup (done < W):  (done + 1) / (W + 1)                  linear ramp (Goyal et al. 2017)
        after, with p = (done - W) / (T - W) in [0, 1):
            constant        1
            linear          m + (1 - m) (1 - p)
            cosine          m + (1 - m) (1 + cos(pi p)) / 2      (Loshchilov & Hutter 2017, SGDR)

    The first step after warmup uses the full rate; decay would reach m one step after the last
    (p = 1), so the last step still learns (the convention of Hugging Face's schedules).

    >>> [round(lr_factor(d, schedule="linear", warmup_steps=1, total_steps=5, min_ratio=0.0), 3) for d in range(5)]
    [0.5, 1.0, 0.75, 0.5, 0.25]
    >>> [round(lr_factor(d, schedule="cosine", warmup_steps=0, total_steps=4, min_ratio=0.1), 4) for d in range(4)]
    [1.0, 0.8682, 0.55, 0.2318]
    """
    if done < warmup_steps:
        return (done + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    p = min((done - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    if schedule == "linear":
        return min_ratio + (1.0 - min_ratio) * (1.0 - p)
    if schedule == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"optim.lr_schedule: {schedule!r} is not one of constant, linear, cosine")


def lr_scheduler(
    optimizer: torch.optim.Optimizer, opt: AdamWConfig, total_steps: int, done: int = 0
) -> torch.optim.lr_scheduler.LambdaLR:
    """`optim`'s schedule on `optimizer`, positioned after `done` steps; call `.step()` after each
    optimizer step. The base rate is `opt.lr` (the run file's, also on resume), never the rate an
    optimizer state loaded from a checkpoint carries."""
    for group in optimizer.param_groups:
        group["initial_lr"] = opt.lr  # LambdaLR's base rate; a resumed scheduler reads it from here

    def factor(step: int) -> float:
        return lr_factor(
            step,
            schedule=opt.lr_schedule,
            warmup_steps=opt.warmup_steps,
            total_steps=total_steps,
            min_ratio=opt.min_lr_ratio,
        )

    return _StepCountSchedule(optimizer, factor, last_epoch=done - 1)


class _StepCountSchedule(torch.optim.lr_scheduler.LambdaLR):
    """`LambdaLR` stepped once per training step, whether or not the step applied an update (a
    skipped non-finite step, a step whose groups all had zero variance). torch warns when the first
    `step()` comes before any `optimizer.step()`, because a schedule meant to follow updates would
    then skip its first rate; this one follows steps, so that warning does not apply."""

    def step(self, epoch=None) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
            super().step(epoch)
