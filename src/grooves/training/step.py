"""One optimizer step: scored groups -> advantages -> token sequences -> loss -> one update.

`train_step` is the step itself, the one function both the trainer's loop (`training.loop`) and the
training service (`grooves.training_service`) call, so a step trained through the service is the loop's
step by construction: it checks which adapter versions sampled the groups (`staleness_stats`,
`rollout.max_staleness`), turns them into training sequences (`to_sequences`: advantages per
group, token in, token out), and `optimize` accumulates the run's loss (`run_loss`: built once
from `[algorithm]`) over memory-sized micro-batches and applies one update; the policy's adapter
is then the next version. With `sync` (a data-parallel rank, `training.distributed`) `optimize` runs
its share of the sequences and the ranks sum their gradients first. `gradient_step` is the span both trainers (RL here, SFT in `training.sft`) take the
policy's weights for: the policy's lock and training phase, gradients zeroed first (the update
is this step's gradient alone, whatever an earlier caller left in `.grad`) and again after.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from grooves.config import OptimConfig, RunConfig
from grooves.core.advantage import group_advantages
from grooves.core.batching import micro_batches
from grooves.core.forward import shared_prefix_logprobs, token_logprobs
from grooves.core.loss import Loss, StepCounts, build_loss
from grooves.core.tokenize import TrainBatch, TrainSequence, prefix_breaks, rollouts, trajectory_to_sequences
from grooves.core.trajectory import TrajectoryGroup
from grooves.policy.base import Policy
from grooves.policy.loaded_adapters import keep_requires_grad
from grooves.training.memory import auto_micro_batch_tokens, pair_tokens
from grooves.training.old_policy import AdapterHistory, old_policy_logprobs, stale_logprobs
from grooves.training.pipeline import staleness_stats

if TYPE_CHECKING:
    from peft import PeftModel


def train_step(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    groups: list[TrajectoryGroup],
    config: RunConfig,
    loss_fn: Loss,
    *,
    sync: StepSync | None = None,
    history: AdapterHistory | None = None,
) -> tuple[dict[str, float], list[TrainSequence]]:
    """One training step on scored groups: (its statistics, the sequences it trained on).

    The groups' turns must come from the live adapter or at most `rollout.max_staleness` versions
    before it (`staleness_stats`, whose numbers are part of the statistics; 0: on-policy). Then
    advantages and sequences, one optimizer step (none when every group was dropped; with `sync`,
    this rank's share of it, see `optimize`), and the adapter is the next version. The update and
    the version bump happen under the policy's lock, so no sampling batch sees the new weights
    under the old version. `history` (`needs_history`: truncated importance sampling of stale
    turns) keeps the adapter's last versions, for the trainer's logprobs under each stale turn's;
    turns whose old logprobs cannot be taken are refused first (`check_versions`).
    """
    live = policy.adapters.version
    staleness = staleness_stats(groups, live, config.rollout.max_staleness)
    check_versions(groups, live, config, history)  # refused before any work, not in the middle of the step
    seqs, seq_stats = to_sequences(groups, config)
    with policy.lock:
        if history is not None:
            history.record(policy.model, live)
        train_stats = (
            optimize(policy, optimizer, seqs, loss_fn, config.optim, sync=sync, history=history)
            if seqs
            else {"loss": 0.0}
        )
        policy.adapters.bump()
    return {**seq_stats, **train_stats, **staleness}, seqs


def needs_history(config: RunConfig) -> bool:
    """Truncated importance sampling (`algorithm.tis_cap`) of turns up to `rollout.max_staleness`
    versions old: the trainer's old logprobs are those under each turn's version (`old_policy`), so a
    caller of `train_step` keeps an `AdapterHistory` of that many versions and passes it."""
    return config.algorithm.tis_cap is not None and config.rollout.max_staleness > 0


def check_versions(
    groups: list[TrajectoryGroup], live: int, config: RunConfig, history: AdapterHistory | None
) -> None:
    """Refuse, before a step changes anything, turns whose old logprobs it cannot take: under
    `needs_history`, a turn that records no adapter version (it may be stale, and the staleness of a
    turn without one can be neither measured nor bounded); under `algorithm.tis_cap`, stale turns
    without a `history` (their old logprobs are under the weights that sampled them, not the live
    adapter's); and with `history`, a stale version whose weights it no longer holds
    (`MissingVersions`)."""
    versions = {t.adapter_version for g in groups for tr in g.ok for t in tr.turns}
    stale = sorted({v for v in versions if v is not None} - {live})
    if stale and history is None and config.algorithm.tis_cap is not None:
        raise ValueError(
            f"turns sampled by adapter versions {stale} (the live adapter is {live}) under algorithm.tis_cap "
            "need the trainer's logprobs under those versions' weights: pass train_step an AdapterHistory, "
            "the same history=AdapterHistory(rollout.max_staleness) at every step (it records each version it "
            "trains; needs_history(config) says when), or train only turns the live adapter sampled"
        )
    if needs_history(config) and None in versions:
        k = config.rollout.max_staleness
        raise ValueError(
            f"turns without an adapter_version: algorithm.tis_cap with rollout.max_staleness = {k} takes each "
            "turn's old logprobs under the adapter version that sampled it, so every turn must record it "
            "(grooves' server reports it with each sample: SampledTurn.adapter_version), or set "
            "rollout.max_staleness = 0"
        )
    if history is not None:
        history.require(stale)


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
def gradient_step(policy: Policy, optimizer: torch.optim.Optimizer) -> Iterator[PeftModel]:
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


KL_REFERENCE = "grooves-kl-reference"
"""The peft adapter name of the frozen copy of the starting adapter (`algorithm.kl_reference`)."""


def load_kl_reference(model: PeftModel, adapter_path: str | Path) -> None:
    """Load the adapter a run started from beside the trained one, frozen, as the KL penalty's
    reference (`reference_weights`); the trained adapter stays the active one."""
    active = model.active_adapter
    with keep_requires_grad(model):
        model.load_adapter(str(adapter_path), adapter_name=KL_REFERENCE, is_trainable=False)
        model.set_adapter(active)


@contextlib.contextmanager
def reference_weights(model: PeftModel) -> Iterator[None]:
    """Inside: `model` computes the KL reference policy, the starting adapter when
    `load_kl_reference` loaded one, else the base model (every adapter disabled)."""
    if KL_REFERENCE not in getattr(model, "peft_config", {}):
        with model.disable_adapter():
            yield
        return
    active = model.active_adapter
    with keep_requires_grad(model):
        model.set_adapter(KL_REFERENCE)
        try:
            yield
        finally:
            model.set_adapter(active)


@contextlib.contextmanager
def checkpointed_layers(model: PeftModel, on: bool) -> Iterator[None]:
    """transformers' gradient checkpointing of every decoder layer for the span, when `on`
    (`optim.gradient_checkpointing`): each layer keeps its input and recomputes the rest in the
    backward (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost", arXiv 1604.06174).
    Non-reentrant (torch's recommended form: no input needs `requires_grad`). It acts only in
    training mode, so sampling between steps is untouched."""
    if not on:
        yield
        return
    # activation_checkpointing_* is the newer name; older transformers have only gradient_checkpointing_*
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        disable = model.activation_checkpointing_disable
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        disable = model.gradient_checkpointing_disable
    try:
        yield
    finally:
        disable()


def _logprobs(model, batch: TrainBatch, prefix_len: int, checkpointing: bool = False):
    """Each token's logprob at the temperature it was sampled at (`batch.temperatures`), not the run's.

    A checkpointed layer drops a KV cache (transformers recomputes it without one), so under
    gradient checkpointing the shared prompt runs only in the packed form, which needs none; with
    an attention that takes no packed mask, each row then runs its prompt itself."""
    if prefix_len and checkpointing:
        if getattr(model.config, "_attn_implementation", None) not in ("sdpa", "eager"):
            return token_logprobs(model, batch)
        return shared_prefix_logprobs(model, batch, prefix_len, pack_suffixes=True)
    if prefix_len:
        return shared_prefix_logprobs(model, batch, prefix_len)
    return token_logprobs(model, batch)


class NonFiniteStep(RuntimeError):
    """A step's loss or gradient norm was not finite, or its update blew up the weights
    (`MAX_WEIGHT_GROWTH`), and `optim.on_nonfinite` is "stop"."""


_SUMMED_STATS = ("loss", "policy_loss", "kl_loss", "num_tokens")
"""Micro-batch statistics already normalized by the whole step: they add up."""
_MAX_STATS = ("mismatch_abs_max",)
"""Micro-batch statistics that are maxima: the step's is the largest. The rest are token means,
weighted by each micro-batch's share of the step's sampled tokens."""


class StepSync(Protocol):
    """How data-parallel ranks split one step (`training.distributed.DataParallel` is one)."""

    def shard(self, seqs: Sequence[TrainSequence]) -> list[TrainSequence]:
        """This rank's share of the step's sequences."""
        ...

    def sum_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Each gradient summed over the ranks, in place."""
        ...

    def gather(self, obj: dict[str, float]) -> list[dict[str, float]]:
        """Every rank's `obj`, in rank order."""
        ...


def optimize(
    policy: Policy,
    optimizer,
    seqs: list[TrainSequence],
    loss_fn: Loss,
    opt: OptimConfig,
    *,
    sync: StepSync | None = None,
    history: AdapterHistory | None = None,
) -> dict[str, float]:
    """One optimizer step over all sequences, accumulated over memory-sized micro-batches.

    With `history`, tokens sampled by an earlier adapter version than the live one get the
    trainer's logprobs under that version as truncated importance sampling's old policy
    (`old_policy.stale_logprobs`, a no-grad forward per stale version in a micro-batch).

    The update is this step's gradient alone (`gradient_step`). A step whose loss or gradient norm
    is inf or NaN is not applied (the adapter and the optimizer state stay as they were): with
    `optim.on_nonfinite = "skip"` one line says so and the stats carry `nonfinite_skipped = 1`; with
    "stop" `NonFiniteStep` is raised. An update that would blow the weights up (`guarded_step`) is
    undone and reported the same way, with `exploding_skipped = 1`.

    With `sync`, this rank runs the loss and backward of its share (`sync.shard(seqs)`) and the
    ranks sum their gradients before clipping: every token's loss is divided by the whole step's
    counts, so the sum is the gradient one process computes over all of `seqs`, and every rank
    applies the same update. The stats are the whole step's on every rank (`combine_stats`).
    """
    if opt.micro_batch_tokens is None:  # a caller without a run (the loop resolves it once per run)
        tokens = auto_micro_batch_tokens(
            policy.model, str(policy.model.device), checkpointing=opt.gradient_checkpointing
        )
        opt = opt.model_copy(update={"micro_batch_tokens": tokens})
    mine = seqs if sync is None else sync.shard(seqs)
    pairs = pair_tokens(policy.model, checkpointing=opt.gradient_checkpointing)  # attention's T x T memory
    batches = micro_batches(mine, opt, policy.tokenizer.pad_token_id or 0, pair_cost=pairs)
    counts = step_counts(seqs)  # the whole step's, on every rank
    totals: dict[str, float] = {}
    with gradient_step(policy, optimizer) as model, checkpointed_layers(model, opt.gradient_checkpointing):
        # under the policy's lock: adapters served beside the trained one may come and go meanwhile
        params = [p for p in model.parameters() if p.requires_grad]
        device = model.get_input_embeddings().weight.device
        live = policy.adapters.version
        for batch, prefix_len in batches:
            batch = batch.to(device)  # the loss reads its old logprobs, advantages and masks there too
            stale = None
            if history is not None:  # before the batch's own forward: it swaps the weights in place

                def forward(b: TrainBatch = batch, p: int = prefix_len) -> torch.Tensor:
                    return _logprobs(model, b, p, opt.gradient_checkpointing)[0]

                stale = stale_logprobs(model, batch, live, history, forward)
            lp, entropy = _logprobs(model, batch, prefix_len, opt.gradient_checkpointing)  # [B, T]
            rollout_ids = batch.rollout_ids  # the loss's sequences: rollouts, split at a prefix break or not
            assert rollout_ids is not None  # TrainBatch.__post_init__ fills it
            lp_ref = None
            if loss_fn.needs_reference:
                with torch.no_grad(), reference_weights(model):
                    lp_ref, _ = _logprobs(model, batch, prefix_len, opt.gradient_checkpointing)
            loss, stats = loss_fn(
                lp,
                batch.old_logprobs,
                batch.advantages,
                batch.sampled_mask,
                rollout_ids,
                counts=counts,
                lp_ref=lp_ref,
                lp_train_old=None if history is None else old_policy_logprobs(lp, stale),
            )
            loss.backward()
            share = float(batch.sampled_mask.sum()) / max(counts.num_tokens, 1)
            stats["token_entropy_mean"] = (
                float(entropy[batch.sampled_mask].mean()) if batch.sampled_mask.any() else 0.0
            )
            stats["loss"] = float(loss.detach())
            _accumulate(totals, stats, share)
        totals["micro_batches"] = float(len(batches))
        if sync is not None:  # before clipping: the norm is the whole gradient's
            sync.sum_gradients(params)
            totals = combine_stats(sync.gather(totals))
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, opt.grad_clip))
        finite = math.isfinite(totals.get("loss", 0.0)) and math.isfinite(grad_norm)
        growth = guarded_step(optimizer, params) if finite else 1.0
    totals["grad_norm"] = grad_norm
    totals["nonfinite_skipped"] = 0.0 if finite else 1.0
    totals["exploding_skipped"] = 0.0 if growth <= MAX_WEIGHT_GROWTH else 1.0
    if not finite:
        _nonfinite_step(policy.adapters.version + 1, totals["loss"], grad_norm, opt.on_nonfinite)
    elif growth > MAX_WEIGHT_GROWTH:
        lr = optimizer.param_groups[0]["lr"]
        _exploding_step(policy.adapters.version + 1, growth, lr, opt.on_nonfinite)
    return totals


def step_counts(seqs: Sequence[TrainSequence]) -> StepCounts:
    """The loss's normalizers for a step of `seqs`: its rollouts (`tokenize.rollouts`; the sequences
    of one split at a prefix break count once, as GRPO's mean over sequences is over rollouts) and
    its sampled tokens."""
    return StepCounts(num_sequences=len(rollouts(seqs)), num_tokens=sum(s.num_sampled for s in seqs))


MAX_WEIGHT_GROWTH = 10.0
"""An update that multiplies the trained weights' norm by more than this is not applied. With AdamW
each weight moves by about lr a step; on SmolLM2-135M with the default LoRA (rank 8, all seven
projections) one step from a fresh adapter multiplies its norm by 1.0000 at lr 2e-4, 4.8 at 0.1
and 47 at 1. Past the bound the weights are on their way to inf, and every rollout after fails."""


def guarded_step(optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter]) -> float:
    """`optimizer.step()`, undone (the weights and the optimizer state as they were) when it
    multiplies the weights' norm by more than `MAX_WEIGHT_GROWTH` or leaves it non-finite. Returns
    the factor (inf when not finite). Costs a copy of the weights and their optimizer state, which
    for a LoRA adapter is a few times the adapter's size."""
    with torch.no_grad():
        before = _norm(params)
        weights = [p.detach().clone() for p in params]
        state = {p: _copy_state(optimizer.state[p]) for p in params if p in optimizer.state}
        optimizer.step()
        after = _norm(params)
        growth = after / before if before > 0 else (1.0 if math.isfinite(after) else math.inf)
        if growth <= MAX_WEIGHT_GROWTH:
            return growth
        for p, w in zip(params, weights, strict=True):
            p.copy_(w)
            if p in state:
                optimizer.state[p] = state[p]
            else:
                optimizer.state.pop(p, None)
    return growth


def _norm(params: Sequence[torch.nn.Parameter]) -> float:
    """The global L2 norm of `params` (as `clip_grad_norm_` takes the gradients'), in float32."""
    if not params:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.float()) for p in params])))


def _copy_state(state: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def _accumulate(totals: dict[str, float], stats: dict[str, float], share: float) -> None:
    for k, v in stats.items():
        if k in _SUMMED_STATS:
            totals[k] = totals.get(k, 0.0) + v
        elif k in _MAX_STATS:
            totals[k] = max(totals.get(k, 0.0), v)
        else:
            totals[k] = totals.get(k, 0.0) + v * share


def combine_stats(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """The step's statistics from the parts of its micro-batches that several ranks accumulated:
    maxima (`_MAX_STATS`) are the largest; everything else adds up, the token means included,
    because each part's means were weighted by its share of the whole step's tokens."""
    out: dict[str, float] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = max(out.get(k, v), v) if k in _MAX_STATS else out.get(k, 0.0) + v
    return out


def _exploding_step(step: int, growth: float, lr: float, mode: str) -> None:
    """One line for a step whose update would have blown up the weights; raises for "stop"."""
    what = (
        f"step {step}: its update multiplied the adapter weights' norm by {growth:.3g} "
        f"(more than {MAX_WEIGHT_GROWTH:g}x in one step, at lr {lr:g}); it was not applied"
    )
    if mode == "stop":
        raise NonFiniteStep(
            f'{what} and the run stops (optim.on_nonfinite = "stop"); lower optim.lr, then --resume'
        )
    print(f'{what}; skipped (optim.on_nonfinite = "skip"; lower optim.lr if it happens again)', flush=True)


def _nonfinite_step(step: int, loss: float, grad_norm: float, mode: str) -> None:
    """One line for a step whose update was not applied; raises for `on_nonfinite = "stop"`."""
    what = f"step {step}: loss {loss} and grad norm {grad_norm}, not finite; its update was not applied"
    if mode == "stop":
        raise NonFiniteStep(
            f'{what} and the run stops (optim.on_nonfinite = "stop"); checkpoints hold only applied steps: '
            "--resume continues from the last one (--set optim.on_nonfinite=skip skips a step that fails again)"
        )
    print(f'{what}; skipped (optim.on_nonfinite = "skip")', flush=True)
