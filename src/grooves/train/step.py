"""One optimizer step: scored groups -> advantages -> token sequences -> loss -> one update.

`train_step` is the step itself, the one function both the trainer's loop (`train.loop`) and the
training service (`grooves.service`) call, so a step trained through the service is the loop's
step by construction: it checks which adapter versions sampled the groups, turns them into
training sequences (`to_sequences`: advantages per group, token in, token out), and `optimize`
accumulates the run's loss (`run_loss`: built once from `[algorithm]`) over memory-sized
micro-batches and applies one update; the policy's adapter is then the next version. `gradient_step` is the span both trainers (RL here, SFT in `train.sft`) take the
policy's weights for: the policy's lock and training phase, gradients zeroed first (the update
is this step's gradient alone, whatever an earlier caller left in `.grad`) and again after.
"""

from __future__ import annotations

import contextlib
import math
import statistics
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


def train_step(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    groups: list[TrajectoryGroup],
    config: RunConfig,
    loss_fn: Loss,
    *,
    max_staleness: int = 0,
) -> tuple[dict[str, float], list[TrainSequence]]:
    """One training step on scored groups: (its statistics, the sequences it trained on).

    The groups' turns must come from the live adapter or at most `max_staleness` versions before
    it (`check_versions`; the trainer's loop is on-policy: 0). Then advantages and sequences, one
    optimizer step (none when every group was dropped), and the adapter is the next version. The
    update and the version bump happen under the policy's lock, so no sampling batch sees the new
    weights under the old version.
    """
    check_versions(groups, policy.adapters.version, max_staleness)
    seqs, seq_stats = to_sequences(groups, config)
    with policy.lock:
        train_stats = optimize(policy, optimizer, seqs, loss_fn, config.optim) if seqs else {"loss": 0.0}
        policy.adapters.bump()
    return {**seq_stats, **train_stats}, seqs


def check_versions(groups: list[TrajectoryGroup], live: int, max_staleness: int = 0) -> None:
    """Every turn sampled for this step must come from the live adapter or one at most
    `max_staleness` versions older (turns without a version, not sampled by the policy, pass)."""
    stale = {
        t.adapter_version
        for g in groups
        for tr in g.ok
        for t in tr.turns
        if t.adapter_version is not None and not live - max_staleness <= t.adapter_version <= live
    }
    if stale:
        allowed = f" (at most {max_staleness} behind it allowed)" if max_staleness else ""
        raise RuntimeError(
            f"rollouts were sampled by adapter versions {sorted(stale)}, but the live adapter is {live}{allowed}"
        )


def reward_stats(groups: list[TrajectoryGroup], prefix: str = "") -> dict[str, float]:
    """Reward and success means of a step's rollouts (failed ones left out); without a `prefix`
    (training, not validation) also the reward spread, each signal's mean, rollout and token counts."""
    trajs = [t for g in groups for t in g.ok]
    rewards = [t.reward for t in trajs]
    out: dict[str, float] = {
        f"{prefix}reward_mean": statistics.fmean(rewards) if rewards else float("nan"),
        f"{prefix}success_rate": statistics.fmean(t.metrics.get("success", 0.0) for t in trajs)
        if trajs
        else float("nan"),
    }
    if not prefix:
        out["reward_std"] = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
        signals = sorted({k for t in trajs for k in t.rewards})
        for name in signals:
            vals = [t.rewards[name] for t in trajs if name in t.rewards]
            out[f"reward/{name}_mean"] = statistics.fmean(vals)
        out["rollouts"] = float(sum(len(g) for g in groups))
        out["failed_rollouts"] = float(sum(len(g) - len(g.ok) for g in groups))
        out["sampled_tokens"] = float(sum(t.num_sampled_tokens for t in trajs))
        out["completion_tokens_mean"] = out["sampled_tokens"] / max(len(trajs), 1)
    return out


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
