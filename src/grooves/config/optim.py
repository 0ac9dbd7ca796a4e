"""The `[optim]` section: AdamW on the LoRA parameters, its learning-rate schedule, micro-batching,
and non-finite steps."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from grooves.config.base import Section


class AdamWConfig(Section):
    """The optimizer's settings both trainers share: `grooves sft`'s `[optim]`, and the base of RL's
    `OptimConfig`."""

    lr: float = Field(2e-4, gt=0)
    """AdamW learning rate. 2e-4 is what the capitals demo learns with, in RL (LoRA rank 8 on a 135M
    model, benchmarks/results/README.md; 5e-5 learned nothing in 20 steps of a strict-format task) and in SFT
    (16 steps reached 0.778 held-out success, 1e-4 0.704); the corpus_search demonstrations were
    trained at 5e-4. LoRA wants ~1e-5..1e-3, not full fine-tuning's 1e-6: lower it for larger
    models or ranks. At most 1: past it every step blows the adapter up."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay on the LoRA weights; 0: none."""
    betas: tuple[float, float] = (0.9, 0.99)
    """Adam's moment decays, each in [0, 1)."""
    grad_clip: float = Field(1.0, gt=0)
    """Max global grad norm (RL gradients spike when a group's advantages are large)."""
    micro_batch_tokens: int = Field(4096, ge=16)
    """Tokens per forward/backward (memory bound); a step accumulates micro-batches into one update."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """The learning rate after warmup (`grooves.training.optim.lr_factor` has the formulas): constant at
    `lr`; or decaying from `lr` towards `min_lr_ratio` x `lr`, linearly or along a half cosine
    (Loshchilov & Hutter 2017, arXiv 1608.03983), over the run's steps. Decay steadies the last
    steps of a long run; constant keeps an RL run able to follow its moving targets to the end."""
    warmup_steps: int = Field(0, ge=0)
    """The first K steps ramp the learning rate linearly up to `lr` (Goyal et al. 2017, arXiv
    1706.02677): step k of K uses k/(K+1) x lr, so no step is wasted at 0. Guards the first updates
    of a fresh adapter against a large step from a noisy first gradient; 0 = none."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Where linear and cosine decay head: `min_lr_ratio` x `lr`, reached one step after the last."""
    share_prefix: bool = True
    """Run a group's shared prompt (RL) or the chats' common start (SFT: an environment's system
    prompt and tool list) once per micro-batch and the rest on top of its KV cache (same gradient
    as separate forwards, a fraction of the tokens). The shared part ends before the first trained
    token of any member, even when completions begin alike. Falls back to `packing`."""
    packing: bool = True
    """Pack several sequences per row (block-diagonal attention) instead of padding to the longest."""

    @field_validator("lr")
    @classmethod
    def _lr(cls, value: float) -> float:
        if value > 1:  # AdamW moves each weight by about lr a step: past 1 a LoRA adapter blows up at once
            raise ValueError(
                "must be at most 1 (AdamW moves each weight by about lr a step; LoRA learns at 1e-5..1e-3)"
            )
        return value

    @field_validator("betas")
    @classmethod
    def _betas(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in value):
            raise ValueError("each beta must be in [0, 1), e.g. (0.9, 0.99)")
        return value


class OptimConfig(AdamWConfig):
    """An RL run's `[optim]`: AdamW's settings, the micro-batch size chosen from free memory when
    unset, gradient checkpointing and what a non-finite step does."""

    micro_batch_tokens: int | None = Field(None, ge=16)  # type: ignore[assignment]  # RL may leave it unset
    """Tokens per forward/backward (memory bound); a step accumulates micro-batches into one update.
    A row's attention memory grows with its length squared and is counted as tokens too
    (`training.memory.pair_tokens`), so a micro-batch holds fewer long rows than short ones.
    Unset: chosen at the start of the run from the device's free memory and the model's size
    (`training.memory.auto_micro_batch_tokens`; the choice is printed and logged as
    `micro_batch_tokens`). Set it where two runs must split their steps alike: the free memory
    differs between machines and moments, and another split rounds the gradient differently."""
    gradient_checkpointing: bool = False
    """Keep only each decoder layer's input in the forward and recompute the rest in the backward
    (transformers' gradient checkpointing): activation memory per token falls from every
    layer's intermediates to one hidden vector per layer, for about a third more compute. The
    same gradient (tested). For bases whose activations do not fit beside their weights."""

    on_nonfinite: Literal["skip", "stop"] = "skip"
    """A step whose loss or grad norm is inf or NaN, or whose update would multiply the adapter
    weights' norm by more than 10 (`training.step.MAX_WEIGHT_GROWTH`: an exploding update), is never
    applied: the adapter and the optimizer state stay as they were. skip: one line says so, the
    step is logged with `nonfinite_skipped = 1` (or `exploding_skipped = 1`) and the run goes on
    with new rollouts. stop: the run ends (`NonFiniteStep`, a one-line message)
    before the step is logged or checkpointed. skip is the default because the weights stay finite
    either way, and a stopped run resumed would sample the same step again (rollouts are seeded by
    step) and fail the same way; stop suits a run watched closely, where such a step should be
    looked at before going on."""
