"""One optimizer step: scored groups -> advantages -> token sequences -> loss -> one update.

`to_sequences` turns a step's groups into training sequences (advantages per group, token in,
token out); `optimize` accumulates the run's loss (`run_loss`: built once from `[algorithm]`)
over memory-sized micro-batches and applies one update. `gradient_step` is the span both trainers (RL here, SFT in `train.sft`) take the
policy's weights for: the policy's lock and training phase, gradients zeroed first (the update
is this step's gradient alone, whatever an earlier caller left in `.grad`) and again after.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import torch

from grooves.config import OptimConfig, RunConfig
from grooves.core.advantage import group_advantages
from grooves.core.batching import micro_batches
from grooves.core.forward import shared_prefix_logprobs, token_logprobs
from grooves.core.loss import Loss, StepCounts, build_loss
from grooves.core.tokenize import TrainBatch, TrainSequence, prefix_breaks, trajectory_to_sequences
from grooves.core.trajectory import TrajectoryGroup
from grooves.policy.base import Policy


def to_sequences(
    groups: list[TrajectoryGroup], config: RunConfig
) -> tuple[list[TrainSequence], dict[str, float]]:
    """Advantages per group, then trajectories -> training sequences (failed rollouts skipped)."""
    alg = config.algorithm
    ok_groups = [g for g in groups if len(g.ok) >= 2]
    adv = group_advantages(
        [g.rewards for g in ok_groups], alg.advantage, scale_by_std=alg.scale_by_std, std_floor=alg.std_floor
    )
    seqs: list[TrainSequence] = []
    breaks = 0
    used = []
    for gi, (group, a) in enumerate(zip(ok_groups, adv.advantages, strict=True)):
        if a is None:
            continue
        for traj, value in zip(group.ok, a.tolist(), strict=True):
            seqs.extend(trajectory_to_sequences(traj, value, group_id=gi))
            breaks += prefix_breaks(traj)
            used.append(abs(value))
    stats = {
        "groups_zero_variance_fraction": adv.num_dropped / max(len(ok_groups), 1),
        "advantage_abs_mean": float(np.mean(used)) if used else 0.0,
        "prefix_breaks": float(breaks),
    }
    return seqs, stats


def run_loss(config: RunConfig) -> Loss:
    """The run's loss, configured once: `[algorithm]`, with `rollout.max_tokens` and the step's
    rollout count (groups_per_step x group_size) for Dr. GRPO's constant."""
    r = config.rollout
    return build_loss(
        config.algorithm,
        max_completion_tokens=r.max_tokens,
        rollouts_per_step=r.groups_per_step * r.group_size,
    )


@contextlib.contextmanager
def gradient_step(policy: Policy, optimizer: torch.optim.Optimizer) -> Iterator[torch.nn.Module]:
    """The span of one optimizer step on `policy.model`, which it yields in training mode.

    Sampling waits (the policy's lock); gradients are zeroed before the first backward and again at
    the end, also when the step was not applied, so no gradient (a NaN one included) outlives it.
    """
    model = policy.model
    with policy.lock, policy.training_phase():
        model.train()
        model.zero_grad(set_to_none=True)
        try:
            yield model
        finally:
            optimizer.zero_grad(set_to_none=True)
            model.zero_grad(set_to_none=True)
            model.eval()


def _logprobs(model, batch: TrainBatch, prefix_len: int):
    """Each token's logprob at the temperature it was sampled at (`batch.temperatures`), not the run's."""
    if prefix_len:
        return shared_prefix_logprobs(model, batch, prefix_len)
    return token_logprobs(model, batch)


class NonFiniteStep(RuntimeError):
    """A step's loss or gradient norm was not finite and `optim.on_nonfinite` is "stop"."""


_SUMMED_STATS = ("loss", "policy_loss", "kl_loss", "num_tokens")
"""Micro-batch statistics already normalized by the whole step: they add up."""
_MAX_STATS = ("mismatch_abs_max",)
"""Micro-batch statistics that are maxima: the step's is the largest. The rest are token means,
weighted by each micro-batch's share of the step's sampled tokens."""


def optimize(
    policy: Policy, optimizer, seqs: list[TrainSequence], loss_fn: Loss, opt: OptimConfig
) -> dict[str, float]:
    """One optimizer step over all sequences, accumulated over memory-sized micro-batches.

    The update is this step's gradient alone (`gradient_step`). A step whose loss or gradient norm
    is inf or NaN is not applied (the adapter and the optimizer state stay as they were): with
    `optim.on_nonfinite = "skip"` one line says so and the stats carry `nonfinite_skipped = 1`; with
    "stop" `NonFiniteStep` is raised.
    """
    batches = micro_batches(seqs, opt, policy.tokenizer.pad_token_id or 0)
    counts = StepCounts(
        num_sequences=len(seqs), num_tokens=sum(s.num_sampled for s in seqs)
    )  # the whole step's
    params = [p for p in policy.model.parameters() if p.requires_grad]
    totals: dict[str, float] = {}
    with gradient_step(policy, optimizer) as model:
        for batch, prefix_len in batches:
            lp, entropy = _logprobs(model, batch, prefix_len)  # [B, T]
            lp_ref = None
            if loss_fn.needs_reference:
                with torch.no_grad(), model.disable_adapter():
                    lp_ref, _ = _logprobs(model, batch, prefix_len)
            loss, stats = loss_fn(
                lp,
                batch.old_logprobs,
                batch.advantages,
                batch.sampled_mask,
                batch.seq_ids,
                counts=counts,
                lp_ref=lp_ref,
            )
            loss.backward()
            share = float(batch.sampled_mask.sum()) / max(counts.num_tokens, 1)
            stats["token_entropy_mean"] = (
                float(entropy[batch.sampled_mask].mean()) if batch.sampled_mask.any() else 0.0
            )
            stats["loss"] = float(loss.detach())
            _accumulate(totals, stats, share)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, opt.grad_clip))
        finite = math.isfinite(totals.get("loss", 0.0)) and math.isfinite(grad_norm)
        if finite:
            optimizer.step()
    totals["grad_norm"] = grad_norm
    totals["micro_batches"] = float(len(batches))
    totals["nonfinite_skipped"] = 0.0 if finite else 1.0
    if not finite:
        _nonfinite_step(policy.adapters.version + 1, totals["loss"], grad_norm, opt.on_nonfinite)
    return totals


def _accumulate(totals: dict[str, float], stats: dict[str, float], share: float) -> None:
    for k, v in stats.items():
        if k in _SUMMED_STATS:
            totals[k] = totals.get(k, 0.0) + v
        elif k in _MAX_STATS:
            totals[k] = max(totals.get(k, 0.0), v)
        else:
            totals[k] = totals.get(k, 0.0) + v * share


def _nonfinite_step(step: int, loss: float, grad_norm: float, mode: str) -> None:
    """One line for a step whose update was not applied; raises for `on_nonfinite = "stop"`."""
    what = f"step {step}: loss {loss} and grad norm {grad_norm}, not finite; its update was not applied"
    if mode == "stop":
        raise NonFiniteStep(
            f'{what} and the run stops (optim.on_nonfinite = "stop"); checkpoints hold only applied steps: '
            "--resume continues from the last one (--set optim.on_nonfinite=skip skips a step that fails again)"
        )
    print(f'{what}; skipped (optim.on_nonfinite = "skip")', flush=True)
