"""The training loop. Read `run` top to bottom: it is the whole algorithm.

    for each step:
        scenarios   <- next `groups_per_step` training scenarios (deterministic order, resumable)
        groups      <- `group_size` rollouts of each, through the OpenAI-compatible policy client
        rewards     <- set by the task's rollout, then by an optional group scorer (judges, gates)
        refill      <- with `refill_zero_variance`, more scenarios while too few groups' rewards differ
        advantages  <- per group (GRPO / Dr. GRPO / RLOO); zero-variance groups are dropped
        sequences   <- token in, token out: sampled ids, sampled-token mask, sampling logprobs
        loss        <- PPO-clip / CISPO / GSPO (+ KL to the adapter-disabled base), micro-batched
        update      <- one AdamW step with grad clipping at the schedule's rate (`optim.lr_schedule`);
                       the live adapter is now version step+1
        log         <- metrics.jsonl, samples, reward curve, checkpoint, validation every K steps,
                       and the experiment trackers `logging.report_to` names

Sampler and trainer are the same peft model here, so "hot-swap" is free: the next request is
answered by the weights this step produced, and each sampled turn records the adapter version
that produced it (checked against the step, so stale weights can't go unnoticed).

Metric keys written per step (metrics.jsonl):
  step, reward_mean, reward_std, reward/<signal>_mean, success_rate, rollouts, failed_rollouts,
  groups_zero_variance_fraction, groups_with_signal, refill_draws, sparse_rewards (1 when the step's
  share of equal-reward groups reached rollout.zero_variance_warning; with refills, when they ran out), advantage_abs_mean, loss,
  policy_loss, kl_mean, clip_fraction, ratio_mean, mismatch_k3_mean (sampler vs trainer logprobs),
  token_entropy_mean, grad_norm,
  nonfinite_skipped (1 when the step's loss or grad norm was not finite and its update was skipped),
  exploding_skipped (1 when its update would have multiplied the adapter weights' norm by more than 10x),
  sampled_tokens, completion_tokens_mean, prefix_breaks, lr, adapter_version,
  seconds_rollout, seconds_score, seconds_train, seconds_step;
  and on validation steps val/reward_mean, val/success_rate. Multi-task runs (`tasks`) add
  task/<name>/{reward_mean,success_rate,groups} per step and val/task/<name>/... on validation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from grooves.config import ConfigError, RunConfig, check_against_model, dump_config, resolve_init_adapter
from grooves.core.trajectory import TrajectoryGroup
from grooves.jsonl import read_jsonl
from grooves.policy import policy_for
from grooves.policy.base import Policy
from grooves.report.write import write_report
from grooves.rollouts.gather import RolloutFn, check_failures, gather
from grooves.rollouts.handle import ModelHandle
from grooves.scale import start_rollouts
from grooves.serve.app import create_app, inprocess_client
from grooves.tasks import Task
from grooves.tasks.mixture import build_task, task_metrics
from grooves.training.checkpoint import (
    CheckpointError,
    TrainState,
    latest_checkpoint,
    load_checkpoint,
    load_with_fallback,
    save_checkpoint,
    seed_everything,
)
from grooves.training.cost import HEARTBEAT_S, plan_line, validates_at
from grooves.training.data import train_stream
from grooves.training.distributed import DataParallel
from grooves.training.evaluate import GroupScorer, evaluate, reward_stats, score_groups, sets_success
from grooves.training.judging import JudgeScorer
from grooves.training.memory import auto_micro_batch_tokens
from grooves.training.old_policy import AdapterHistory
from grooves.training.optim import adamw, lr_scheduler
from grooves.training.pipeline import RolloutPipeline, VersionPins
from grooves.training.runlog import (
    RunFolderError,
    RunLog,
    check_run_dir,
    clear_run_outputs,
    lock_run_dir,
    show_bars,
    step_line,
)
from grooves.training.sft import ChatError, read_chats, run_sft, stage_config, validation_overlap
from grooves.training.sparse import SparseRewardWarning, groups_with_signal, refill_count
from grooves.training.step import load_kl_reference, needs_history, run_loss, train_step
from grooves.training.trackers import start_trackers
from grooves.watch import Watch

StepObserver = Callable[[int, dict[str, Any], list[TrajectoryGroup]], dict[str, Any] | None]
"""Watches a step (e.g. the reward-hacking watch). May add metrics; never changes training."""


def build_policy(config: RunConfig) -> Policy:
    """The run's policy: `model.backend` with the `[model]`, `[lora]` and `[vllm]` sections."""
    return policy_for(config.model, config.lora, seed=config.seed, served_name=config.name, vllm=config.vllm)


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
        # this process's place in a data-parallel run (a world of one unless started by torchrun)
        dp = DataParallel.from_env()
        dp.start(config.model.device)
        closing.callback(dp.close)
        # the folder, the checkpoint to continue and the task: everything that can refuse the start
        run_dir = Path(config.output_dir)
        if dp.main:  # rank 0 holds the folder; every rank continues the checkpoint it picks
            closing.enter_context(lock_run_dir(run_dir))  # until the run ends: one trainer per folder
        if dp.active and (config.sft is not None or config.rollout.refill_zero_variance):
            raise ConfigError(
                "[sft] and rollout.refill_zero_variance run in one process only; run them without torchrun"
            )
        # a run stopped during its [sft] stage has no RL checkpoint yet: --resume continues the stage
        in_stage = resume and config.sft is not None and latest_checkpoint(run_dir) is None
        checkpoint = dp.on_main(
            lambda: _checkpoint_to_resume(run_dir, resume and not in_stage, overwrite)
        )  # verified before the model loads
        seed_everything(config.seed)
        task = task or build_task(config)  # one task, or a weighted mixture (`tasks`)
        check_against_model(config)  # max_tokens, target_modules, device: from config.json, no weights loaded
        # [judge]: a judge that cannot be used refuses the start in one line
        if score is None and config.judge is not None:
            judged = JudgeScorer(config.judge, seed=config.seed)
            await judged.start()
            closing.push_async_callback(judged.aclose)
            score = judged
        if dp.main:  # the work ahead, before anything slow: episodes, tokens, validations
            _say(plan_line(config, task, start=_step_of(checkpoint)))
        if config.sft is not None and checkpoint is None:  # supervised warm start, then RL from its adapter
            config = await _sft_stage(config, task, run_dir, resume=in_stage, overwrite=overwrite)

        # the policy behind an OpenAI-compatible client, the optimizer, the scenarios
        policy = build_policy(_on_device(config, dp.device(config.model.device)))
        start = _kl_start_adapter(config, run_dir)
        if start is not None:  # the KL penalty's reference: the adapter the RL began from, frozen
            load_kl_reference(policy.model, start)
        config = _resolve_micro_batch(config, policy, dp.device(config.model.device))
        app = create_app(policy)
        closing.callback(
            app.state.scheduler.close
        )  # an exit while its thread is inside torch aborts the process
        client = inprocess_client(app)
        closing.push_async_callback(client.close)
        r = config.rollout
        handle = ModelHandle(
            client, policy.served_name, r.temperature, r.top_p, r.max_tokens, seed=config.seed
        )
        params = [p for p in policy.model.parameters() if p.requires_grad]
        dp.broadcast_parameters(params)  # every rank starts from rank 0's adapter
        optimizer = adamw(
            params, lr=config.optim.lr, betas=config.optim.betas, weight_decay=config.optim.weight_decay
        )
        loss = run_loss(config)  # [algorithm], configured once
        stream = train_stream(
            task, config.seed
        )  # ScenarioStream; per-task streams drawn by weight for a mixture
        rollouts = start_rollouts(
            config.rollout, task.rollout, policy
        )  # in this process, or Ray actors over HTTP
        closing.callback(rollouts.close)
        pins = VersionPins(policy, [app.state.adapters], r.max_staleness) if r.max_staleness else None
        history = AdapterHistory(r.max_staleness) if needs_history(config) else None  # TIS of stale turns

        # continue the checkpoint, or start afresh; the folder changes only now
        state = TrainState(step=0, data_position=0)
        if checkpoint is not None:
            checkpoint, state = load_with_fallback(  # a checkpoint that fails to load: the one before it
                checkpoint,
                lambda path: load_checkpoint(path, policy.model, optimizer, policy.generator),
                _say if dp.main else None,
            )
            stream.position = state.data_position
            policy.adapters.version = state.step
            if pins is not None:
                pins.restore(checkpoint)
                if history is not None:  # the versions the steps in flight at the checkpoint sampled with
                    for version in pins.restored(checkpoint):
                        history.load(version, pins.path(version))
            if dp.main:
                print(f"resuming {run_dir} from step {state.step} ({checkpoint})", flush=True)
        elif dp.main:
            clear_run_outputs(run_dir)  # a fresh run: nothing of an earlier one stays to mix with it
        # warmup and decay; every rank steps it alike, so every rank's update uses the same rate
        scheduler = lr_scheduler(optimizer, config.optim, config.steps, done=state.step)
        config_toml = dump_config(config)
        log = None
        if dp.main:  # metrics.jsonl and samples/, and the trackers `logging.report_to` names
            trackers = start_trackers(
                config.logging, config.name, run_dir, config_toml, resumed_at=state.step
            )
            log = RunLog(run_dir, trackers=trackers)
            closing.callback(log.close)
            log.truncate_after(
                state.step if checkpoint is not None else -1
            )  # on resume: no step appears twice
            (run_dir / "config.toml").write_text(config_toml)
        no_success = _MissingSuccess(task, quiet=not dp.main)
        if state.step == 0 and config.validation.at_start:
            val_metrics, val_groups = await validate(task, handle, config, 0, rollouts.rollout, score, dp=dp)
            no_success.check(val_groups)
            if log is not None:
                log.log({"step": 0, **val_metrics})
                log.samples(0, val_groups, name="validation")
        watch = (
            _start_watch(config, log, watch, resumed_at=state.step if checkpoint is not None else None)
            if log is not None
            else None
        )
        observers = [*observers, watch.observe_step] if watch is not None else list(observers)

        warm = config.model.init_adapter is not None  # set by an [sft] stage too
        sparse = SparseRewardWarning(r.zero_variance_warning, say=_say, warm=warm)
        # progress bars on rank 0's terminal; else one line per step there (`step_line`) and heartbeats
        bars = dp.main and show_bars(config.logging.progress)
        beat = HEARTBEAT_S if dp.main and not bars else None
        bar = closing.enter_context(_step_bar(config, state.step, bars))
        last = min(config.steps, stop_after) if stop_after is not None else config.steps

        async def step_rollouts(step: int, scenarios: list[dict], model: str | None) -> list[TrajectoryGroup]:
            # groups of `group_size` on the step's scenarios (this rank's share), rewards set by the task
            return await gather(
                rollouts.rollout,
                handle if model is None else dataclasses.replace(handle, name=model),
                scenarios,
                r.group_size,
                concurrency=r.concurrency,
                max_failure_fraction=r.max_failure_fraction if not dp.active else 1.0,
                progress=bars,
                description=f"step {step} rollouts",
                seed_key=(step,),
                part=dp.share(len(scenarios) * r.group_size) if dp.active else None,
                heartbeat=beat,
            )

        ahead = RolloutPipeline(
            next_step=state.step + 1,
            last_step=config.steps,  # with stop_after, steps past it may be in flight: discarded as after a kill
            max_staleness=r.max_staleness,
            per_step=r.groups_per_step,
            stream=stream,
            launch=step_rollouts,
            pins=pins,
            live_version=lambda: policy.adapters.version,
        )
        closing.push_async_callback(ahead.close)  # rollouts still in flight are discarded
        while state.step < last:
            if (me := asyncio.current_task()) is not None and me.cancelling():
                # a Ctrl-C whose cancellation something below swallowed (a task awaited at that moment
                # that finished normally) still stops the run, at this step boundary
                raise asyncio.CancelledError
            step = state.step + 1
            t0 = time.perf_counter()
            # rollouts: started up to max_staleness steps ago, or now; every rank's share merged
            groups = dp.merge_groups(await ahead.take(step))
            if dp.active:
                check_failures(groups, r.max_failure_fraction)
            no_success.check(groups)
            t_rollout = time.perf_counter()
            # rewards of whole groups: judges, reward models, gates (once, on rank 0)
            groups, score_metrics = await score_groups(score, groups, dp)
            refill_s = 0.0  # refills' rollouts count as rollout time, not scoring time
            # dynamic sampling: more scenarios while too few groups have rewards that differ
            refill_draws, scored = 0, [(score_metrics, len(groups))]
            while r.refill_zero_variance and (
                more := refill_count(
                    r.groups_per_step, groups_with_signal(groups), refill_draws, r.max_refill_draws
                )
            ):
                t_refill = time.perf_counter()
                extra = await gather(
                    rollouts.rollout,
                    handle,
                    [s for _, s in stream.take(more)],
                    r.group_size,
                    concurrency=r.concurrency,
                    max_failure_fraction=r.max_failure_fraction,
                    progress=bars,
                    heartbeat=beat,
                    description=f"step {step} refill",
                    seed_key=(step, refill_draws),  # (step, draws before) never equals a first draw's (step,)
                )
                refill_s += time.perf_counter() - t_refill
                refill_draws += more
                extra, extra_metrics = await score_groups(score, extra, dp)
                scored.append((extra_metrics, len(extra)))
                groups += extra
            if refill_draws:
                score_metrics = _merge_scored(scored)
            t_score = time.perf_counter()
            # advantages and token sequences, then one optimizer step; the next request samples the new adapter
            lr = optimizer.param_groups[0]["lr"]  # the rate this step's update uses
            step_stats, _ = await _train_step(
                policy, optimizer, groups, config, loss, dp, beside=r.max_staleness > 0, history=history
            )
            scheduler.step()  # by step count, applied or not, so a resumed run keeps the same rates
            t_train = time.perf_counter()

            counted = [g for g in groups if len(g.ok) >= 2]
            signal = groups_with_signal(counted)
            short = max(0, r.groups_per_step - signal) if r.refill_zero_variance else None
            metrics: dict[str, Any] = {
                "step": step,
                "refill_draws": float(refill_draws),
                "groups_with_signal": float(signal),
                "sparse_rewards": float(sparse.observe(step, len(counted) - signal, len(counted), short)),
                **reward_stats(groups),
                **task_metrics(groups),
                **score_metrics,
                **step_stats,
            }
            metrics.update(
                lr=lr,
                micro_batch_tokens=config.optim.micro_batch_tokens,
                adapter_version=policy.adapters.version,
                seconds_rollout=t_rollout - t0 + refill_s,
                seconds_score=t_score - t_rollout - refill_s,
                seconds_train=t_train - t_score,
            )
            if validates_at(config.validation, step, config.steps):
                val_metrics, val_groups = await validate(
                    task, handle, config, step, rollouts.rollout, score, dp=dp
                )
                metrics.update(val_metrics)
                if log is not None:
                    log.samples(step, val_groups, name="validation")
            for observe in observers:  # after validation: the watch compares val/ metrics with the reward
                metrics.update(observe(step, metrics, groups) or {})
            metrics["seconds_step"] = time.perf_counter() - t0

            # the run folder (rank 0): metrics, samples, checkpoint, reward curve
            position = ahead.position(step)  # refills (max_staleness 0 only) drew after it
            state = TrainState(step=step, data_position=stream.position if refill_draws else position)
            pause = watch is not None and watch.should_pause
            if log is not None:
                extra = pins.checkpoint_versions(step, config.steps) if pins is not None else None
                log.log(metrics)
                if step % config.logging.samples_every == 0:
                    log.samples(step, groups)
                if step % config.logging.checkpoint_every == 0 or step == config.steps or pause:
                    with policy.lock:  # no adapter is loaded or unloaded beside it while it is saved
                        save_checkpoint(
                            run_dir,
                            state,
                            policy.model,
                            optimizer,
                            policy.generator,
                            config_toml,
                            config.logging.keep_checkpoints,
                            extra,
                            keep_best_by=config.logging.keep_best_by,
                            keep_best_mode=config.logging.keep_best_mode,
                        )
                log.plot()
                bar.update(1)
                bar.set_postfix(
                    reward=f"{metrics['reward_mean']:.3f}", step_s=f"{metrics['seconds_step']:.1f}"
                )
                if not bars:  # a log file, or progress = false: one line per step, always
                    print(step_line(metrics, config.steps), flush=True)
            if dp.broadcast(pause):
                if dp.main:
                    print(
                        f"paused by the reward-hacking watch at step {step}; read {run_dir}/findings.jsonl, then --resume",
                        flush=True,
                    )
                break
        bar.close()
        if dp.main:
            write_report(run_dir)
        return run_dir


async def _sft_stage(
    config: RunConfig, task: Task, run_dir: Path, *, resume: bool, overwrite: bool
) -> RunConfig:
    """Run the `[sft]` stage into `<run_dir>/sft`; returns the config with RL starting from its adapter.

    The stage's folder follows the run's rules: an earlier stage's checkpoints are continued with
    `resume`, deleted with `overwrite`, else the start is refused. A chat that demonstrates one
    of the task's validation scenarios, or that the policy could not be trained on, is refused
    as a `ConfigError` naming `sft.data` and the line."""
    folder = run_dir / "sft"
    if folder.exists() and not resume:
        if any((folder / "checkpoints").glob("step_*")) and not overwrite:
            raise RunFolderError(
                f"{folder} holds an earlier [sft] stage; continue it with --resume, replace it with --overwrite, "
                "or set another output_dir"
            )
        shutil.rmtree(folder)
    if resume and latest_checkpoint(folder) is None:
        raise RunFolderError(
            f"--resume: no checkpoint in {run_dir / 'checkpoints'} or {folder / 'checkpoints'}; start without --resume"
        )
    stage = config.sft
    try:
        overlap = validation_overlap(read_chats(stage.data), _held_out(task))
    except (ChatError, OSError) as exc:
        raise ConfigError(f"sft.data: {exc}") from None
    if overlap:
        raise ConfigError(
            f"sft.data: {stage.data} {overlap}; demonstrations come from the train split "
            "(grooves env demos NAME --split train)"
        )
    _say(f"[sft] stage: {stage.data} -> {folder}")
    try:
        await run_sft(stage_config(config, folder), resume=resume)
    except ChatError as exc:
        raise ConfigError(f"sft.data: {exc}") from None
    return config.model_copy(update={"model": config.model.model_copy(update={"init_adapter": str(folder)})})


def _held_out(task: Task) -> list[dict[str, Any]]:
    """The scenarios no training data may show: validation, and test where the task has that split."""
    held = list(task.scenarios("validation"))
    try:
        held += task.scenarios("test")
    except ValueError:  # a task of train and validation only (capitals)
        pass
    return held


def _kl_start_adapter(config: RunConfig, run_dir: Path) -> Path | None:
    """The adapter `algorithm.kl_reference = "start"` compares against: the one the RL began from
    (`model.init_adapter`; on a resumed run with an `[sft]` stage, the stage's, which set it at the
    start). None: no KL penalty, `kl_reference = "base"`, or a run from a fresh adapter (then the
    start is the base model)."""
    a = config.algorithm
    if a.kl_beta == 0.0 or a.kl_reference != "start":
        return None
    source = config.model.init_adapter or (str(run_dir / "sft") if config.sft is not None else None)
    return resolve_init_adapter(source) if source else None


def _on_device(config: RunConfig, device: str) -> RunConfig:
    """`config` with `model.device` set to this rank's device (the run file's `cuda` is rank r's GPU)."""
    if device == config.model.device:
        return config
    return config.model_copy(update={"model": config.model.model_copy(update={"device": device})})


def _resolve_micro_batch(config: RunConfig, policy: Policy, device: str) -> RunConfig:
    """`optim.micro_batch_tokens` from the free memory once the model has loaded, when unset (said on one line)."""
    if config.optim.micro_batch_tokens is not None:
        return config
    tokens = auto_micro_batch_tokens(policy.model, device, checkpointing=config.optim.gradient_checkpointing)
    if config.logging.progress:
        _say(f"optim.micro_batch_tokens = {tokens}, from the free memory of {device} (set it to fix it)")
    optim = config.optim.model_copy(update={"micro_batch_tokens": tokens})
    return config.model_copy(update={"optim": optim})


async def _train_step(
    policy, optimizer, groups, config: RunConfig, loss, dp: DataParallel, *, beside: bool, history=None
) -> tuple[dict[str, float], list]:
    """`step.train_step` (the service's step too), this rank's share of it in a data-parallel run;
    `beside` (rollouts ahead of the trainer) runs it on a worker thread, so the event loop keeps the
    next steps' rollouts going while it trains."""
    sync = dp if dp.active else None
    if not beside:
        return train_step(policy, optimizer, groups, config, loss, sync=sync, history=history)
    return await asyncio.to_thread(
        train_step, policy, optimizer, groups, config, loss, sync=sync, history=history
    )


def _checkpoint_to_resume(run_dir: Path, resume: bool, overwrite: bool) -> Path | None:
    """The newest intact checkpoint when resuming (None otherwise); refuses a folder that holds
    another run unless `overwrite` (see `runlog.check_run_dir`)."""
    check_run_dir(run_dir, resume=resume, overwrite=overwrite)
    checkpoint = latest_checkpoint(run_dir, warn=_say) if resume else None
    if resume and checkpoint is None:
        raise RunFolderError(f"--resume: no checkpoint in {run_dir / 'checkpoints'}; start without --resume")
    return checkpoint


async def validate(
    task: Task,
    handle: ModelHandle,
    config: RunConfig,
    step: int,
    rollout: RolloutFn | None = None,
    score: GroupScorer | None = None,
    *,
    dp: DataParallel | None = None,
) -> tuple[dict[str, float], list[TrajectoryGroup]]:
    """The run's `[validation]` through `evaluate` (what `grooves eval` runs too). `rollout` runs each
    validation rollout (default: the task's own, in this process).

    `score` is the training run's group scorer: validation rewards come from the same judges and
    gates as training rewards, so val/reward_mean means what reward_mean means (its metrics, such
    as judge coverage, are logged under val/ too). In a data-parallel run (`dp`) each rank runs
    its share of the rollouts and every rank gets all of them.
    """
    v = config.validation
    return await evaluate(
        task,
        handle,
        scenarios=v.scenarios,
        samples=v.samples,
        temperature=v.temperature,
        seed=config.seed + 1,
        step=step,
        concurrency=config.rollout.concurrency,
        rollout=rollout,
        score=score,
        progress=show_bars(config.logging.progress),
        dp=dp,
        heartbeat=None if show_bars(config.logging.progress) else HEARTBEAT_S,
    )


class _WatchObserver:
    def __init__(self, watch: Watch):
        self.watch = watch

    @property
    def should_pause(self) -> bool:
        return self.watch.should_pause

    def observe_step(
        self, step: int, metrics: dict[str, Any], groups: list[TrajectoryGroup]
    ) -> dict[str, Any]:
        self.watch.observe(step, metrics, groups)
        return dict(self.watch.stats)


def _start_watch(
    config: RunConfig, log: RunLog, given: Watch | None, resumed_at: int | None
) -> _WatchObserver | None:
    """The run's watch (`given`, else the one `config.watch` describes, if enabled); on a resumed
    run the detectors first judge the steps so far again, to rebuild their history."""
    if given is not None:
        given.run_dir = given.run_dir or log.dir
        watch = given
    elif config.watch.enabled:
        watch = Watch(config.watch, run_dir=log.dir)
    else:
        return None
    if resumed_at is not None:  # the detectors judge the next step against the whole run so far
        watch.resume(resumed_at, _watch_history(log, resumed_at))
    return _WatchObserver(watch)


def _watch_history(log: RunLog, upto: int) -> Iterator[tuple[int, dict[str, Any], list[TrajectoryGroup]]]:
    """Steps 1..`upto` as the watch observed them: each logged row without what the step added after
    its observers ran (the watch's own statistics, the step's total seconds), and the step's groups
    where samples/ has them (`logging.samples_every`; else the text detectors skip that step)."""
    for row in sorted(log.rows(), key=lambda r: r["step"]):
        step = row["step"]
        if not 1 <= step <= upto or "reward_mean" not in row:
            continue
        metrics = {k: v for k, v in row.items() if not k.startswith("watch/") and k != "seconds_step"}
        yield step, metrics, log.step_samples(step) or []


def _merge_scored(scored: list[tuple[dict[str, float], int]]) -> dict[str, float]:
    """One step's scorer metrics from its batches (the first draw, then each refill): counts and
    seconds add up; means and fractions are averaged weighted by each batch's groups."""
    if len(scored) <= 1:
        return scored[0][0] if scored else {}
    total = sum(n for _, n in scored)
    out: dict[str, float] = {}
    for key in {k for m, _ in scored for k in m}:
        values = [(m[key], n) for m, n in scored if key in m]
        if key.endswith(("_mean", "_coverage", "_fraction", "_rate")):
            out[key] = sum(v * n for v, n in values) / max(sum(n for _, n in values), 1)
        else:
            out[key] = sum(v for v, _ in values)
    return out if total else {}


def _step_bar(config: RunConfig, start: int, show: bool):
    from tqdm.auto import tqdm

    return tqdm(total=config.steps, initial=start, desc=config.name, disable=not show, dynamic_ncols=True)


class _MissingSuccess:
    """Says once, on stderr, when a task's first finished rollouts set no `metrics["success"]`: the
    run's success rate then counts every rollout as a failure, and so does choosing the best
    checkpoint by it (`--select best`), without anything else showing why. `quiet`: the other
    ranks of a data-parallel run, which see the same rollouts as rank 0."""

    def __init__(self, task: Task, *, quiet: bool = False):
        self.task = task
        self.checked = quiet

    def check(self, groups: list[TrajectoryGroup]) -> None:
        if self.checked or (found := sets_success(groups)) is None:
            return
        self.checked = True
        if not found:
            name = getattr(self.task, "name", type(self.task).__name__)
            _say(
                f'task {name!r} sets no traj.metrics["success"]: success_rate counts every rollout as 0, '
                "--select best too; set it in the rollout (1.0 solved, 0.0 not)"
            )


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) ended a run. The message says where: the last step logged and the
    checkpoint `--resume` continues from (`checkpoint_step`, None when none was written)."""

    def __init__(self, message: str, checkpoint_step: int | None):
        super().__init__(message)
        self.checkpoint_step = checkpoint_step


def train(config: RunConfig, **options) -> Path:
    """Synchronous entry point: `grooves.training(load_config("run.toml"))`.

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
    return RunInterrupted(
        f"interrupted after step {done} of {steps}; the last checkpoint is step {step} ({checkpoint})", step
    )


def _step_of(checkpoint: Path | None) -> int:
    """The step a checkpoint holds (0 for none): where a resumed run continues."""
    if checkpoint is None:
        return 0
    return int(json.loads((checkpoint / "state.json").read_text())["step"])


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
