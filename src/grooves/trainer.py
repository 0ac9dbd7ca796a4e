"""The training loop. Read `run` top to bottom: it is the whole algorithm.

    for each step:
        scenarios   <- next `groups_per_step` training scenarios (deterministic order, resumable)
        groups      <- `group_size` rollouts of each, through the OpenAI-compatible policy client
        rewards     <- set by the task's rollout, then by an optional group scorer (judges, gates)
        advantages  <- per group (GRPO / Dr. GRPO / RLOO); zero-variance groups are dropped
        sequences   <- token in, token out: sampled ids, sampled-token mask, sampling logprobs
        loss        <- PPO-clip / CISPO / GSPO (+ KL to the adapter-disabled base), micro-batched
        update      <- one AdamW step with grad clipping; the live adapter is now version step+1
        log         <- metrics.jsonl, samples, reward curve, checkpoint, validation every K steps

Sampler and trainer are the same peft model here, so "hot-swap" is free: the next request is
answered by the weights this step produced, and each sampled turn records the adapter version
that produced it (checked against the step, so stale weights can't go unnoticed).

Metric keys written per step (metrics.jsonl):
  step, reward_mean, reward_std, reward/<signal>_mean, success_rate, rollouts, failed_rollouts,
  groups_zero_variance_fraction, advantage_abs_mean, loss, policy_loss, kl_mean, clip_fraction,
  ratio_mean, mismatch_k3_mean (sampler vs trainer logprobs), token_entropy_mean, grad_norm,
  nonfinite_skipped (1 when the step's loss or grad norm was not finite and its update was skipped),
  sampled_tokens, completion_tokens_mean, prefix_breaks, lr, adapter_version,
  seconds_rollout, seconds_score, seconds_train, seconds_step;
  and on validation steps val/reward_mean, val/success_rate. Multi-task runs (`tasks`) add
  task/<name>/{reward_mean,success_rate,groups} per step and val/task/<name>/... on validation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from grooves.advantage import group_advantages
from grooves.checkpoint import (
    CheckpointError,
    TrainState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from grooves.config import RunConfig, check_against_model, dump_config, resolve_init_adapter
from grooves.forward import shared_prefix_logprobs, token_logprobs
from grooves.jsonl import read_jsonl
from grooves.lora_addmm import addmm_lora
from grooves.loss import compute_loss
from grooves.optim import adamw
from grooves.policy.handle import ModelHandle
from grooves.policy.transformers_policy import LoraSettings, TransformersPolicy
from grooves.runlog import RunFolderError, RunLog, check_run_dir, clear_run_outputs, lock_run_dir
from grooves.scale import start_rollouts
from grooves.server import create_app, inprocess_client
from grooves.tasks import Task
from grooves.tasks.mixture import build_task, task_metrics, train_stream
from grooves.tokenize import (
    TrainBatch,
    TrainSequence,
    pack_batches,
    pad_batch,
    prefix_breaks,
    trajectory_to_sequences,
)
from grooves.trajectory import RolloutFn, TrajectoryGroup, gather

if TYPE_CHECKING:
    from grooves.watch import Watch

GroupScorer = Callable[[list[TrajectoryGroup]], Awaitable[Any]]
"""Optional stage after rollouts: sets rewards on whole groups (judges, reward models, gates)
and returns metrics to log (a dict, or an object with `.metrics()` such as
`rewards.Composite.score_groups`'s result), e.g. judge tokens per step."""

StepObserver = Callable[[int, dict[str, Any], list[TrajectoryGroup]], dict[str, Any] | None]
"""Watches a step (e.g. the reward-hacking watch). May add metrics; never changes training."""


class ScenarioStream:
    """Training scenarios in a fresh seeded order each epoch; `position` makes it resumable."""

    def __init__(self, scenarios: Sequence[dict[str, Any]], seed: int, position: int = 0):
        if not scenarios:
            raise ValueError("the task has no training scenarios")
        self.scenarios = list(scenarios)
        self.seed = seed
        self.position = position

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.scenarios)))
        random.Random(self.seed * 7919 + epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[tuple[int, dict[str, Any]]]:
        out = []
        for _ in range(k):
            epoch, i = divmod(self.position, len(self.scenarios))
            index = self._order(epoch)[i]
            out.append((index, self.scenarios[index]))
            self.position += 1
        return out


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_policy(config: RunConfig) -> TransformersPolicy:
    init = resolve_init_adapter(config.model.init_adapter) if config.model.init_adapter else None
    lora = LoraSettings(
        rank=config.lora.rank,
        alpha=config.lora.alpha,
        dropout=config.lora.dropout,
        target_modules=tuple(config.lora.target_modules),
    )
    if config.model.backend == "vllm":  # imported only here: CPU installs never need vllm
        from grooves.policy.vllm_policy import VLLMPolicy

        v = config.vllm
        return VLLMPolicy(
            config.model.base_model, lora=lora, dtype=config.model.dtype, device=config.model.device,
            tool_format=config.model.tool_format, seed=config.seed, served_name=config.name,
            gpu_memory_utilization=v.gpu_memory_utilization, sleep_level=v.sleep_level,
            max_model_len=v.max_model_len, enforce_eager=v.enforce_eager, adapter_path=init,
        )  # fmt: skip
    return TransformersPolicy(
        config.model.base_model,
        lora=lora,
        adapter_path=init,  # trained further (the policy loads it trainable when `lora` is set)
        dtype=config.model.dtype,
        device=config.model.device,
        tool_format=config.model.tool_format,
        seed=config.seed,
        served_name=config.name,
        merge_for_sampling=config.model.merge_lora_for_sampling,
        reuse_freed_memory=config.model.reuse_freed_memory,
        fused_decode=config.model.fused_decode,
        matmul_forms=config.model.matmul_forms,
    )


def to_sequences(groups: list[TrajectoryGroup], config: RunConfig) -> tuple[list[TrainSequence], dict[str, float]]:
    """Advantages per group, then trajectories -> training sequences (failed rollouts skipped)."""
    alg = config.algorithm
    ok_groups = [g for g in groups if len(g.ok) >= 2]
    adv = group_advantages([g.rewards for g in ok_groups], alg.advantage, scale_by_std=alg.scale_by_std, std_floor=alg.std_floor)
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


MIN_SHARED_PREFIX = 8
"""Below this many shared tokens, computing a prefix once is not worth a separate forward."""


def _common_prefix(seqs: Sequence[TrainSequence]) -> int:
    """How many leading ids every member shares, stopping before any member's first sampled token.

    The shared prefix is context only: its own tokens get no logprob, so no loss. Completions
    of a group often begin with the same sampled tokens ("The capital of ...", the same first tool
    call); those are trained like any other sampled token, so they stay in each row's suffix.
    """
    first = seqs[0].input_ids
    n = min(len(s) for s in seqs) - 1  # at least one token of each row stays in the suffix
    n = min([n] + [s.sampled_mask.index(True) for s in seqs if True in s.sampled_mask])
    for s in seqs[1:]:
        ids = s.input_ids
        i = 0
        while i < n and ids[i] == first[i]:
            i += 1
        n = i
    return n


def micro_batches(seqs: list[TrainSequence], opt, pad: int) -> list[tuple[TrainBatch, int]]:
    """(batch, shared prefix length or 0) pairs of at most ~`micro_batch_tokens` tokens each.

    With `share_prefix`, each group's sequences go together so their prompt is computed once;
    sequences without a worthwhile common prefix are packed (or padded) as usual.
    """
    out: list[tuple[TrainBatch, int]] = []
    rest: list[TrainSequence] = []
    if opt.share_prefix:
        by_group: dict[int, list[TrainSequence]] = {}
        for s in seqs:
            by_group.setdefault(s.group_id, []).append(s)
        for members in by_group.values():
            prefix = _common_prefix(members) if len(members) > 1 else 0
            if prefix < MIN_SHARED_PREFIX:
                rest.extend(members)
                continue
            suffix = max(len(s) for s in members) - prefix
            per = max(1, (opt.micro_batch_tokens - prefix) // max(suffix, 1))
            for i in range(0, len(members), per):
                out.append((pad_batch(members[i : i + per], pad_token_id=pad), prefix))
    else:
        rest = list(seqs)
    if rest and opt.packing:
        out.extend((b, 0) for b in pack_batches(rest, opt.micro_batch_tokens, pad_token_id=pad))
    elif rest:
        width = max(len(s) for s in rest)
        per = max(1, opt.micro_batch_tokens // width)
        out.extend((pad_batch(rest[i : i + per], pad_token_id=pad), 0) for i in range(0, len(rest), per))
    return out


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


def optimize(policy: TransformersPolicy, optimizer, seqs: list[TrainSequence], config: RunConfig) -> dict[str, float]:
    """One optimizer step over all sequences, accumulated over memory-sized micro-batches.

    The update is this step's gradient alone: gradients are zeroed first, whatever an earlier
    caller left in `.grad`. A step whose loss or gradient norm is inf or NaN is not applied (the
    adapter and the optimizer state stay as they were): with `optim.on_nonfinite = "skip"` one line
    says so and the stats carry `nonfinite_skipped = 1`; with "stop" `NonFiniteStep` is raised.
    """
    model, alg, opt = policy.model, config.algorithm, config.optim
    batches = micro_batches(seqs, opt, policy.tokenizer.pad_token_id or 0)
    num_tokens = sum(s.num_sampled for s in seqs)
    # Dr. GRPO's constant counts every rollout the step asked for, dropped groups included
    num_rollouts = config.rollout.groups_per_step * config.rollout.group_size
    params = [p for p in model.parameters() if p.requires_grad]
    totals: dict[str, float] = {}
    with policy.lock, policy.training_phase(), addmm_lora(model):
        model.train()
        model.zero_grad(set_to_none=True)
        for batch, prefix_len in batches:
            lp, entropy = _logprobs(model, batch, prefix_len)  # [B, T]
            lp_ref = None
            if alg.kl_beta > 0:
                with torch.no_grad(), model.disable_adapter():
                    lp_ref, _ = _logprobs(model, batch, prefix_len)
            loss, stats = compute_loss(
                lp, batch.old_logprobs, batch.advantages, batch.sampled_mask, batch.seq_ids,
                policy_loss=alg.loss, eps_low=alg.eps_low, eps_high=alg.eps_high,
                aggregation=alg.aggregation, max_completion_tokens=config.rollout.max_tokens,
                lp_ref=lp_ref, beta=alg.kl_beta, kl_kind=alg.kl_kind,
                num_sequences=len(seqs), num_tokens=num_tokens, num_rollouts=num_rollouts,
            )  # fmt: skip
            loss.backward()
            share = float(batch.sampled_mask.sum()) / max(num_tokens, 1)
            stats["token_entropy_mean"] = float(entropy[batch.sampled_mask].mean()) if batch.sampled_mask.any() else 0.0
            stats["loss"] = float(loss.detach())
            for k, v in stats.items():
                if k in _SUMMED_STATS:
                    totals[k] = totals.get(k, 0.0) + v
                elif k in _MAX_STATS:
                    totals[k] = max(totals.get(k, 0.0), v)
                else:
                    totals[k] = totals.get(k, 0.0) + v * share
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, opt.grad_clip))
        finite = math.isfinite(totals.get("loss", 0.0)) and math.isfinite(grad_norm)
        if finite:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)  # also on a skipped step: no NaN gradient is left behind
        model.eval()
    totals["grad_norm"] = grad_norm
    totals["micro_batches"] = float(len(batches))
    totals["nonfinite_skipped"] = 0.0 if finite else 1.0
    if not finite:
        _nonfinite_step(policy.adapter_version + 1, totals["loss"], grad_norm, opt.on_nonfinite)
    return totals


def _nonfinite_step(step: int, loss: float, grad_norm: float, mode: str) -> None:
    """One line for a step whose update was not applied; raises for `on_nonfinite = "stop"`."""
    what = f"step {step}: loss {loss} and grad norm {grad_norm}, not finite; its update was not applied"
    if mode == "stop":
        raise NonFiniteStep(
            f"{what} and the run stops (optim.on_nonfinite = \"stop\"); checkpoints hold only applied steps: "
            "--resume continues from the last one (--set optim.on_nonfinite=skip skips a step that fails again)"
        )
    print(f"{what}; skipped (optim.on_nonfinite = \"skip\")", flush=True)


def _reward_stats(groups: list[TrajectoryGroup], prefix: str = "") -> dict[str, float]:
    trajs = [t for g in groups for t in g.ok]
    rewards = [t.reward for t in trajs]
    out: dict[str, float] = {
        f"{prefix}reward_mean": statistics.fmean(rewards) if rewards else float("nan"),
        f"{prefix}success_rate": statistics.fmean(t.metrics.get("success", 0.0) for t in trajs) if trajs else float("nan"),
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


async def validate(
    task: Task, handle: ModelHandle, config: RunConfig, step: int, rollout: RolloutFn | None = None,
    score: GroupScorer | None = None,
) -> tuple[dict[str, float], list[TrajectoryGroup]]:
    """`rollout` runs each validation rollout (default: the task's own, in this process).

    `score` is the training run's group scorer: validation rewards come from the same judges and
    gates as training rewards, so val/reward_mean means what reward_mean means (its metrics, such
    as judge coverage, are logged under val/ too).
    """
    scenarios = task.scenarios("validation")[: config.validation.scenarios]
    val_handle = ModelHandle(handle.client, handle.name, config.validation.temperature, 1.0, handle.max_tokens, seed=config.seed + 1)
    groups = await gather(
        rollout or task.rollout, val_handle, scenarios, config.validation.samples, concurrency=config.rollout.concurrency,
        max_failure_fraction=1.0, progress=config.logging.progress, description=f"validation @ {step}",
        seed_key=(step,),
    )  # fmt: skip
    scored = {f"val/{k}": v for k, v in _as_metrics(await score(groups)).items()} if score is not None else {}
    return {**_reward_stats(groups, prefix="val/"), **task_metrics(groups, prefix="val/"), **scored}, groups


async def run(
    config: RunConfig,
    *,
    task: Task | None = None,
    resume: bool = False,
    overwrite: bool = False,
    score: GroupScorer | None = None,
    observers: Sequence[StepObserver] = (),
    watch: Watch | None = None,
    stop_after: int | None = None,
) -> Path:
    """Train according to `config`; returns the run directory. `stop_after` ends early (tests).

    The run folder holds one run: a folder with checkpoints is continued with `resume` or replaced
    with `overwrite` (the old run's outputs are deleted once the model has loaded), else refused;
    a second trainer on the folder is refused while this one runs (see `runlog.lock_run_dir`). A
    start that fails leaves the folder as it was. However the run ends (done, an error, Ctrl-C),
    the folder is unlocked and the sampler thread and rollout workers are stopped before this
    returns or raises.

    `watch` replaces the reward-hacking watch `config.watch` describes, e.g. one built with an
    `embed` or `rescore` function (`Watch(config.watch, embed=..., rescore=...)`); without a run
    directory of its own it writes into the run's.
    """
    async with contextlib.AsyncExitStack() as closing:
        return await _run(config, closing, task, resume, overwrite, score, observers, watch, stop_after)


async def _run(
    config: RunConfig,
    closing: contextlib.AsyncExitStack,
    task: Task | None,
    resume: bool,
    overwrite: bool,
    score: GroupScorer | None,
    observers: Sequence[StepObserver],
    watch: Watch | None,
    stop_after: int | None,
) -> Path:
    run_dir = Path(config.output_dir)
    closing.enter_context(lock_run_dir(run_dir))  # until the run ends: one trainer per folder
    check_run_dir(run_dir, resume=resume, overwrite=overwrite)
    checkpoint = latest_checkpoint(run_dir, warn=_say) if resume else None  # verified before the model loads
    if resume and checkpoint is None:
        raise RunFolderError(f"--resume: no checkpoint in {run_dir / 'checkpoints'}; start without --resume")
    seed_everything(config.seed)
    task = task or build_task(config)  # one task, or a weighted mixture (`tasks`)
    check_against_model(config)  # max_tokens, target_modules, device: from config.json, no weights loaded

    policy = build_policy(config)
    app = create_app(policy)
    closing.callback(app.state.scheduler.close)  # an exit while its thread is inside torch aborts the process
    client = inprocess_client(app)
    closing.push_async_callback(client.close)
    handle = ModelHandle(client, policy.served_name, config.rollout.temperature, config.rollout.top_p, config.rollout.max_tokens, seed=config.seed)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = adamw(params, lr=config.optim.lr, betas=config.optim.betas, weight_decay=config.optim.weight_decay)
    stream = train_stream(task, config.seed)  # ScenarioStream; per-task streams drawn by weight for a mixture
    rollouts = start_rollouts(config.rollout, task.rollout, policy)  # in this process, or Ray actors over HTTP
    closing.callback(rollouts.close)

    state = TrainState(step=0, data_position=0)
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, policy.model, optimizer, policy.generator)
        stream.position = state.data_position
        policy.adapter_version = state.step
    else:
        clear_run_outputs(run_dir)  # a fresh run: nothing of an earlier one stays to mix with it
    # the folder changes only now, after everything that can refuse the start has passed
    log = RunLog(run_dir)
    log.truncate_after(state.step if checkpoint is not None else -1)  # on resume: no step appears twice
    config_toml = dump_config(config)
    (run_dir / "config.toml").write_text(config_toml)

    if state.step == 0:
        val_metrics, val_groups = await validate(task, handle, config, 0, rollouts.rollout, score)
        log.log({"step": 0, **val_metrics})
        log.samples(0, val_groups, name="validation")

    watch = _start_watch(config, run_dir, watch)
    if watch is not None:
        observers = [*observers, watch.observe_step]
        if checkpoint is not None:  # the detectors judge the next step against the whole run so far
            watch.watch.resume(state.step, _watch_history(run_dir, state.step))

    bar = closing.enter_context(_step_bar(config, state.step))
    last = min(config.steps, stop_after) if stop_after is not None else config.steps
    while state.step < last:
        step = state.step + 1
        t0 = time.perf_counter()
        picked = stream.take(config.rollout.groups_per_step)
        groups = await gather(
            rollouts.rollout, handle, [s for _, s in picked], config.rollout.group_size,
            concurrency=config.rollout.concurrency, max_failure_fraction=config.rollout.max_failure_fraction,
            progress=config.logging.progress, description=f"step {step} rollouts", seed_key=(step,),
        )  # fmt: skip
        t_rollout = time.perf_counter()
        score_metrics = _as_metrics(await score(groups)) if score is not None else {}
        t_score = time.perf_counter()

        _check_on_policy(groups, policy.adapter_version)
        seqs, seq_stats = to_sequences(groups, config)
        train_stats = optimize(policy, optimizer, seqs, config) if seqs else {"loss": 0.0}
        policy.bump_version()
        t_train = time.perf_counter()

        metrics: dict[str, Any] = {"step": step, **_reward_stats(groups), **task_metrics(groups), **score_metrics, **seq_stats, **train_stats}
        metrics.update(
            lr=config.optim.lr, adapter_version=policy.adapter_version, seconds_rollout=t_rollout - t0,
            seconds_score=t_score - t_rollout, seconds_train=t_train - t_score,
        )  # fmt: skip
        if config.validation.every and step % config.validation.every == 0 or step == config.steps:
            val_metrics, val_groups = await validate(task, handle, config, step, rollouts.rollout, score)
            metrics.update(val_metrics)
            log.samples(step, val_groups, name="validation")
        for observe in observers:  # after validation: the watch compares val/ metrics with the reward
            metrics.update(observe(step, metrics, groups) or {})
        metrics["seconds_step"] = time.perf_counter() - t0

        state = TrainState(step=step, data_position=stream.position)
        log.log(metrics)
        if step % config.logging.samples_every == 0:
            log.samples(step, groups)
        if step % config.logging.checkpoint_every == 0 or step == config.steps:
            save_checkpoint(run_dir, state, policy.model, optimizer, policy.generator, config_toml, config.logging.keep_checkpoints)
        log.plot()
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", step_s=f"{metrics['seconds_step']:.1f}")
        if watch is not None and watch.should_pause:
            save_checkpoint(run_dir, state, policy.model, optimizer, policy.generator, config_toml, config.logging.keep_checkpoints)
            print(f"paused by the reward-hacking watch at step {step}; read {run_dir}/findings.jsonl, then --resume", flush=True)
            break
    bar.close()
    _write_report(run_dir)
    return run_dir


class _WatchObserver:
    def __init__(self, watch):
        self.watch = watch

    @property
    def should_pause(self) -> bool:
        return self.watch.should_pause

    def observe_step(self, step: int, metrics: dict[str, Any], groups: list[TrajectoryGroup]) -> dict[str, Any]:
        self.watch.observe(step, metrics, groups)
        return dict(self.watch.stats)


def _watch_history(run_dir: Path, upto: int):
    """Steps 1..`upto` as the watch observed them: each logged row without what the step added after
    its observers ran (the watch's own statistics, the step's total seconds), and the step's groups
    where samples/ has them (`logging.samples_every`; else the text detectors skip that step)."""
    from grooves.report.rundir import load_run

    run = load_run(run_dir)
    for row in run.metrics:
        step = row["step"]
        if not 1 <= step <= upto or "reward_mean" not in row:
            continue
        metrics = {k: v for k, v in row.items() if not k.startswith("watch/") and k != "seconds_step"}
        yield step, metrics, run.samples(step) if step in run.sample_files else []


def _start_watch(config: RunConfig, run_dir: Path, given: Watch | None) -> _WatchObserver | None:
    if given is not None:
        given.run_dir = given.run_dir or run_dir
        return _WatchObserver(given)
    if not config.watch.enabled:
        return None
    from grooves.watch import Watch

    return _WatchObserver(Watch(config.watch, run_dir=run_dir))


def _write_report(run_dir: Path) -> None:
    from grooves.report.write import write_report

    write_report(run_dir)


def _as_metrics(result: Any) -> dict[str, float]:
    if result is None:
        return {}
    return dict(result.metrics()) if hasattr(result, "metrics") else dict(result)


def _check_on_policy(groups: list[TrajectoryGroup], version: int) -> None:
    """Every turn sampled this step must come from the adapter the trainer is about to update."""
    stale = {t.adapter_version for g in groups for tr in g.ok for t in tr.turns if t.adapter_version not in (None, version)}
    if stale:
        raise RuntimeError(f"rollouts were sampled by adapter versions {sorted(stale)}, but the live adapter is {version}")


def _step_bar(config: RunConfig, start: int):
    from tqdm.auto import tqdm

    return tqdm(total=config.steps, initial=start, desc=config.name, disable=not config.logging.progress, dynamic_ncols=True)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) ended a run. The message says where: the last step logged and the
    checkpoint `--resume` continues from (`checkpoint_step`, None when none was written)."""

    def __init__(self, message: str, checkpoint_step: int | None):
        super().__init__(message)
        self.checkpoint_step = checkpoint_step


def train(config: RunConfig, **options) -> Path:
    """Synchronous entry point: `grooves.train(load_config("run.toml"))`.

    Ctrl-C cancels the run at its next await (a step's rollouts, scoring or validation; an
    optimizer step or checkpoint being written finishes first), `run` releases what it holds,
    and this raises `RunInterrupted` saying where the run stopped.
    """
    try:
        return asyncio.run(run(config, **options))
    except KeyboardInterrupt:
        raise _interrupted(Path(config.output_dir), config.steps) from None


def _interrupted(run_dir: Path, steps: int) -> RunInterrupted:
    """Where an interrupted run stopped, read from its folder (what a resume will see)."""
    metrics = run_dir / "metrics.jsonl"
    try:
        rows = read_jsonl(metrics) if metrics.exists() else []
        checkpoint = latest_checkpoint(run_dir)
    except (ValueError, CheckpointError):  # a damaged file: say what can be said
        rows, checkpoint = [], None
    done = max((r.get("step", 0) for r in rows if "loss" in r), default=0)
    if checkpoint is None:
        return RunInterrupted(f"interrupted after step {done} of {steps}, before the first checkpoint", None)
    step = int(json.loads((checkpoint / "state.json").read_text())["step"])
    return RunInterrupted(f"interrupted after step {done} of {steps}; the last checkpoint is step {step} ({checkpoint})", step)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
