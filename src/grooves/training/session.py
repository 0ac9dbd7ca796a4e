"""What a training run holds while it runs, set up in the order that lets a start fail cheaply.

`claim_run` takes what can refuse the start before any weights load: this process's place in a
data-parallel run, the run folder's lock, the checkpoint to continue, the task, the model's
config.json checks and the `[judge]`. `open_run` then loads the rest into a `Session`: the policy
behind an OpenAI-compatible in-process client, the optimizer and its schedule, the loss, the
scenario stream, the rollout runner (in this process or on Ray), the pinned adapter versions of
rollouts ahead of the trainer, and the checkpoint continued (or the folder cleared for a fresh
run). Everything that must be released when the run ends, however it ends, is pushed onto the
run's exit stack as it is made.

The session also holds the two things a step does with the policy besides sampling:
`train_step` (`step.train_step`, the function the training service runs too) and `validate`
(`evaluate`, the function `grooves eval` runs too).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grooves.config import ConfigError, RunConfig, check_against_model, dump_config, resolve_init_adapter
from grooves.core.loss import Loss
from grooves.core.trajectory import TrajectoryGroup
from grooves.policy import policy_for
from grooves.policy.base import Policy
from grooves.rollouts.handle import ModelHandle
from grooves.scale import RolloutRunner, start_rollouts
from grooves.serve.app import create_app, inprocess_client
from grooves.tasks import Task
from grooves.tasks.mixture import build_task
from grooves.training.checkpoint import (
    TrainState,
    latest_checkpoint,
    load_checkpoint,
    load_with_fallback,
    seed_everything,
)
from grooves.training.cost import HEARTBEAT_S, plan_line
from grooves.training.data import train_stream
from grooves.training.distributed import DataParallel
from grooves.training.evaluate import GroupScorer, evaluate, sets_success
from grooves.training.judging import JudgeScorer
from grooves.training.memory import auto_micro_batch_tokens
from grooves.training.old_policy import AdapterHistory
from grooves.training.optim import adamw, lr_scheduler
from grooves.training.pipeline import VersionPins
from grooves.training.runlog import RunFolderError, check_run_dir, clear_run_outputs, lock_run_dir, show_bars
from grooves.training.step import load_kl_reference, needs_history, run_loss, train_step


@dataclass
class Claim:
    """What a run holds before any weights load (`claim_run`)."""

    dp: DataParallel
    run_dir: Path
    checkpoint: Path | None
    """The RL checkpoint to continue; None for a fresh start."""
    sft_first: bool
    """Run the `[sft]` stage before RL: the file has one and RL has no checkpoint yet."""
    sft_resume: bool
    """A resumed run stopped during its `[sft]` stage: the stage continues."""
    task: Task
    score: GroupScorer | None


async def claim_run(
    config: RunConfig,
    closing: contextlib.AsyncExitStack,
    *,
    task: Task | None,
    score: GroupScorer | None,
    resume: bool,
    overwrite: bool,
) -> Claim:
    """Everything that can refuse the start, checked before any weights load. The folder is
    locked for as long as `closing` is open, but nothing in it changes yet."""
    # this process's place in a data-parallel run (a world of one without torchrun)
    dp = DataParallel.from_env()
    dp.start(config.model.device)
    closing.callback(dp.close)
    run_dir = Path(config.output_dir)
    if dp.main:  # rank 0 holds the folder; every rank continues the checkpoint it picks
        closing.enter_context(lock_run_dir(run_dir))  # until the run ends: one trainer per folder
    if dp.active and (config.sft is not None or config.rollout.refill_zero_variance):
        raise ConfigError(
            "[sft] and rollout.refill_zero_variance run in one process only; run them without torchrun"
        )
    # a run stopped during its [sft] stage has no RL checkpoint yet: --resume continues the stage
    in_stage = resume and config.sft is not None and latest_checkpoint(run_dir) is None
    checkpoint = dp.on_main(lambda: _checkpoint_to_resume(run_dir, resume and not in_stage, overwrite))
    seed_everything(config.seed)
    task = task or build_task(config)  # one task, or a weighted mixture (`tasks`)
    check_against_model(config)  # max_tokens, target_modules, device: from config.json, no weights loaded
    if score is None and config.judge is not None:  # [judge]: refused in one line if it cannot be used
        judged = JudgeScorer(config.judge, seed=config.seed)
        await judged.start()
        closing.push_async_callback(judged.aclose)
        score = judged
    if dp.main:  # the work ahead, before anything slow: episodes, tokens, validations
        _say(plan_line(config, task, start=_step_of(checkpoint)))
    sft_first = config.sft is not None and checkpoint is None
    return Claim(dp, run_dir, checkpoint, sft_first, in_stage, task, score)


@dataclass
class Session:
    """A run's policy, optimizer, data and rollouts, and the step it has reached (`open_run`)."""

    config: RunConfig
    """The resolved config: what the run trains with, saved with every checkpoint."""
    config_toml: str
    dp: DataParallel
    run_dir: Path
    task: Task
    score: GroupScorer | None
    policy: Policy
    handle: ModelHandle
    """The policy's in-process OpenAI-compatible client with the run's sampling settings."""
    optimizer: Any
    scheduler: Any
    loss: Loss
    stream: Any
    """The training scenarios (`data.ScenarioStream`, or per-task streams drawn by weight)."""
    rollouts: RolloutRunner
    pins: VersionPins | None
    """Adapter versions served to rollouts ahead of the trainer (`rollout.max_staleness`)."""
    history: AdapterHistory | None
    state: TrainState
    resumed: bool
    bars: bool
    """Progress bars on this process's terminal (rank 0's, with `logging.progress`)."""
    check_success: _MissingSuccess = field(repr=False)

    async def train_step(self, groups: list[TrajectoryGroup]) -> dict[str, Any]:
        """`step.train_step` on the scored groups (this rank's share in a data-parallel run): the
        advantages, one optimizer update, the adapter's next version; the schedule's next rate.
        With rollouts ahead of the trainer it runs on a worker thread, so the event loop keeps the
        next steps' rollouts going meanwhile."""
        t0 = time.perf_counter()
        lr = self.optimizer.param_groups[0]["lr"]  # the rate this step's update uses
        args = (self.policy, self.optimizer, groups, self.config, self.loss)
        sync = self.dp if self.dp.active else None
        if self.config.rollout.max_staleness > 0:
            stats, _ = await asyncio.to_thread(train_step, *args, sync=sync, history=self.history)
        else:
            stats, _ = train_step(*args, sync=sync, history=self.history)
        self.scheduler.step()  # by step count, applied or not, so a resumed run keeps the same rates
        return {
            **stats,
            "lr": lr,
            "micro_batch_tokens": self.config.optim.micro_batch_tokens,
            "adapter_version": self.policy.adapters.version,
            "seconds_train": time.perf_counter() - t0,
        }

    async def validate(self, step: int) -> tuple[dict[str, float], list[TrajectoryGroup]]:
        """The run's `[validation]` through `evaluate` (what `grooves eval` runs too), each rollout
        on the run's rollout runner. Validation rewards come from the same judges and gates as
        training rewards (`score`), so val/reward_mean means what reward_mean means. In a
        data-parallel run each rank runs its share of the rollouts and every rank gets all of them."""
        v, handle = self.config.validation, self.handle
        if v.max_tokens is not None:
            handle = dataclasses.replace(handle, max_tokens=v.max_tokens)
        metrics, groups = await evaluate(
            self.task,
            handle,
            scenarios=v.scenarios,
            samples=v.samples,
            temperature=v.temperature,
            seed=self.config.seed + 1,
            step=step,
            concurrency=self.config.rollout.concurrency,
            rollout=self.rollouts.rollout,
            score=self.score,
            progress=show_bars(self.config.logging.progress),
            dp=self.dp,
            heartbeat=None if show_bars(self.config.logging.progress) else HEARTBEAT_S,
        )
        self.check_success(groups)
        return metrics, groups


async def open_run(config: RunConfig, claim: Claim, closing: contextlib.AsyncExitStack) -> Session:
    """Load the policy and everything a step needs; continue `claim.checkpoint`, or clear the
    folder of an earlier run's outputs (the folder changes only now, once the model has loaded)."""
    dp = claim.dp
    # the policy behind an OpenAI-compatible client
    policy = build_policy(_on_device(config, dp.device(config.model.device)))
    start = kl_start_adapter(config, claim.run_dir)
    if start is not None:  # the KL penalty's reference: the adapter the RL began from, frozen
        load_kl_reference(policy.model, start)
    config = _resolve_micro_batch(config, policy, dp.device(config.model.device))
    app = create_app(policy)
    closing.callback(app.state.scheduler.close)  # an exit while its thread is inside torch aborts the process
    client = inprocess_client(app)
    closing.push_async_callback(client.close)
    r = config.rollout
    handle = ModelHandle(client, policy.served_name, r.temperature, r.top_p, r.max_tokens, seed=config.seed)
    # the optimizer on the adapter's weights, the loss, the scenarios, where rollouts run
    params = [p for p in policy.model.parameters() if p.requires_grad]
    dp.broadcast_parameters(params)  # every rank starts from rank 0's adapter
    optimizer = adamw(
        params, lr=config.optim.lr, betas=config.optim.betas, weight_decay=config.optim.weight_decay
    )
    loss = run_loss(config)  # [algorithm], configured once
    stream = train_stream(claim.task, config.seed)  # per-task streams drawn by weight for a mixture
    rollouts = start_rollouts(r.runner, config.ray, claim.task.rollout, policy)  # here, or Ray actors
    closing.callback(rollouts.close)
    pins = VersionPins(policy, [app.state.adapters], r.max_staleness) if r.max_staleness else None
    history = AdapterHistory(r.max_staleness) if needs_history(config) else None  # TIS of stale turns
    state = _continue(claim, policy, optimizer, stream, pins, history)
    # warmup and decay; every rank steps it alike, so every rank's update uses the same rate
    scheduler = lr_scheduler(optimizer, config.optim, config.steps, done=state.step)
    return Session(
        config=config,
        config_toml=dump_config(config),
        dp=dp,
        run_dir=claim.run_dir,
        task=claim.task,
        score=claim.score,
        policy=policy,
        handle=handle,
        optimizer=optimizer,
        scheduler=scheduler,
        loss=loss,
        stream=stream,
        rollouts=rollouts,
        pins=pins,
        history=history,
        state=state,
        resumed=claim.checkpoint is not None,
        bars=dp.main and show_bars(config.logging.progress),
        check_success=_MissingSuccess(claim.task, quiet=not dp.main),
    )


def build_policy(config: RunConfig) -> Policy:
    """The run's policy: `model.backend` with the `[model]`, `[lora]` and `[vllm]` sections."""
    return policy_for(config.model, config.lora, seed=config.seed, served_name=config.name, vllm=config.vllm)


def _continue(claim: Claim, policy, optimizer, stream, pins, history) -> TrainState:
    """The checkpoint's weights, optimizer, RNG states and data position (a checkpoint that fails
    to load: the one before it), or a fresh start in a cleared folder."""
    if claim.checkpoint is None:
        if claim.dp.main:
            clear_run_outputs(claim.run_dir)  # a fresh run: nothing of an earlier one stays to mix with it
        return TrainState(step=0, data_position=0)
    checkpoint, state = load_with_fallback(
        claim.checkpoint,
        lambda path: load_checkpoint(path, policy.model, optimizer, policy.generator),
        _say if claim.dp.main else None,
    )
    stream.position = state.data_position
    policy.adapters.version = state.step
    if pins is not None:
        pins.restore(checkpoint)
        if history is not None:  # the versions the steps in flight at the checkpoint sampled with
            for version in pins.restored(checkpoint):
                history.load(version, pins.path(version))
    if claim.dp.main:
        print(f"resuming {claim.run_dir} from step {state.step} ({checkpoint})", flush=True)
    return state


def _checkpoint_to_resume(run_dir: Path, resume: bool, overwrite: bool) -> Path | None:
    """The newest intact checkpoint when resuming (None otherwise); refuses a folder that holds
    another run unless `overwrite` (see `runlog.check_run_dir`)."""
    check_run_dir(run_dir, resume=resume, overwrite=overwrite)
    checkpoint = latest_checkpoint(run_dir, warn=_say) if resume else None
    if resume and checkpoint is None:
        raise RunFolderError(f"--resume: no checkpoint in {run_dir / 'checkpoints'}; start without --resume")
    return checkpoint


def _step_of(checkpoint: Path | None) -> int:
    """The step a checkpoint holds (0 for none): where a resumed run continues."""
    if checkpoint is None:
        return 0
    return int(json.loads((checkpoint / "state.json").read_text())["step"])


def kl_start_adapter(config: RunConfig, run_dir: Path) -> Path | None:
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


class _MissingSuccess:
    """Says once, on stderr, when a task's first finished rollouts set no `metrics["success"]`: the
    run's success rate then counts every rollout as a failure, and so does choosing the best
    checkpoint by it (`--select best`), without anything else showing why. `quiet`: the other
    ranks of a data-parallel run, which see the same rollouts as rank 0."""

    def __init__(self, task: Task, *, quiet: bool = False):
        self.task = task
        self.checked = quiet

    def __call__(self, groups: list[TrajectoryGroup]) -> None:
        if self.checked or (found := sets_success(groups)) is None:
            return
        self.checked = True
        if not found:
            name = getattr(self.task, "name", type(self.task).__name__)
            _say(
                f'task {name!r} sets no traj.metrics["success"]: success_rate counts every rollout as 0, '
                "--select best too; set it in the rollout (1.0 solved, 0.0 not)"
            )


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
