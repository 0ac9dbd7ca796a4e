"""The training loop. Read `run` top to bottom: it is the whole algorithm.

    claim       <- the run folder (locked), the checkpoint to continue, the task, the [judge]:
                   what can refuse the start, before any weights load (`session.claim_run`)
    [sft]       <- with an `[sft]` section and no RL checkpoint yet: supervised training on
                   demonstrations into <output_dir>/sft; RL starts from its adapter (`sft.run_stage`)
    session     <- the policy behind an OpenAI-compatible client, the optimizer, the scenarios,
                   the rollout runner, the checkpoint continued (`session.open_run`)
    for each step:
        groups      <- `collect` (`collect.Collector`): the next `groups_per_step` training
                       scenarios (deterministic order, resumable), `group_size` rollouts of each
                       through the policy client, rewards set by the task's rollout and then by an
                       optional group scorer (judges, gates), and with `refill_zero_variance` more
                       scenarios while too few groups' rewards differ
        stats       <- `train_step` (`step.train_step`, the training service's step too):
                       advantages per group (GRPO / Dr. GRPO / RLOO; zero-variance groups dropped),
                       sequences token in, token out (sampled ids, sampled-token mask, sampling
                       logprobs), the loss (PPO-clip / CISPO / GSPO, + KL to the reference),
                       micro-batched, one AdamW step with grad clipping at the schedule's rate
                       (`optim.lr_schedule`); the live adapter is now version step+1
        validation  <- every `validation.every` steps and after the last (`evaluate`)
        record      <- `record` (`recorder.Recorder`): the observers (the reward-hacking watch),
                       metrics.jsonl, samples, a checkpoint when `[checkpoint]` says, the reward
                       curve, progress, and the experiment trackers `logging.report_to` names

Sampler and trainer are the same peft model here, so "hot-swap" is free: the next request is
answered by the weights this step produced, and each sampled turn records the adapter version
that produced it (checked against the step, so stale weights can't go unnoticed).

Metric keys written per step (metrics.jsonl):
  step, reward_mean, reward_std, reward/<signal>_mean, success_rate, rollouts, failed_rollouts,
  groups_zero_variance_fraction, groups_with_signal, refill_draws, sparse_rewards (1 when the step's
  share of equal-reward groups reached rollout.zero_variance_warning; with refills, when they ran
  out), advantage_abs_mean, loss, policy_loss, kl_mean, clip_fraction, ratio_mean,
  mismatch_k3_mean (sampler vs trainer logprobs), token_entropy_mean, grad_norm,
  nonfinite_skipped (1 when the step's loss or grad norm was not finite and its update was skipped),
  exploding_skipped (1 when its update would have multiplied the adapter weights' norm by more than 10x),
  sampled_tokens, completion_tokens_mean, prefix_breaks, lr, micro_batch_tokens, adapter_version,
  seconds_rollout, seconds_score, seconds_train, seconds_step;
  and on validation steps val/reward_mean, val/success_rate. Multi-task runs (`tasks`) add
  task/<name>/{reward_mean,success_rate,groups} per step and val/task/<name>/... on validation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

from grooves.config import RunConfig
from grooves.jsonl import read_jsonl
from grooves.tasks import Task
from grooves.training.checkpoint import CheckpointError, latest_checkpoint
from grooves.training.collect import Collector
from grooves.training.cost import validates_at
from grooves.training.evaluate import GroupScorer
from grooves.training.recorder import Recorder, StepObserver
from grooves.training.session import claim_run, open_run
from grooves.training.sft import run_stage
from grooves.watch import Watch


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
    async with contextlib.AsyncExitStack() as closing:  # released however the run ends
        claim = await claim_run(config, closing, task=task, score=score, resume=resume, overwrite=overwrite)
        if claim.sft_first:  # a supervised warm start, then RL from its adapter
            config = await run_stage(
                config, claim.task, claim.run_dir, resume=claim.sft_resume, overwrite=overwrite
            )
        session = await open_run(config, claim, closing)
        config = session.config  # resolved: micro_batch_tokens chosen from the free memory when unset
        record = Recorder(session, closing, observers=observers, watch=watch)
        if session.state.step == 0 and config.validation.at_start:  # the starting model, scored
            record.validation(0, *await session.validate(0))
        collect = Collector(session, closing)
        last = min(config.steps, stop_after) if stop_after is not None else config.steps
        for step in range(session.state.step + 1, last + 1):
            _stop_if_cancelled()
            started = time.perf_counter()
            batch = await collect(step)  # rollouts, rewards of whole groups, refills
            stats = await session.train_step(batch.groups)  # advantages, loss, one optimizer update
            metrics = {"step": step, **batch.metrics, **stats}
            if validates_at(config.validation, step, config.steps):
                metrics.update(record.validation(step, *await session.validate(step)))
            if record(step, metrics, batch.groups, started=started, data_position=batch.data_position):
                break  # paused by the reward-hacking watch, after its checkpoint
        record.finish()
        return claim.run_dir


def _stop_if_cancelled() -> None:
    """A Ctrl-C whose cancellation something below swallowed (a task awaited at that moment that
    finished normally) still stops the run, at this step boundary."""
    if (me := asyncio.current_task()) is not None and me.cancelling():
        raise asyncio.CancelledError


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
    return RunInterrupted(
        f"interrupted after step {done} of {steps}; the last checkpoint is step {step} ({checkpoint})", step
    )
