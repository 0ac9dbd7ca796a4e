"""Supervised fine-tuning of the same LoRA adapter on example chats (`grooves sft`).

Data is JSONL, one OpenAI-style chat per line: `{"messages": [...], "tools": [...]}` (tools
optional). The loss is the mean negative log-likelihood of the assistant's tokens only, so the
adapter learns to write the answers, not to predict the user's questions or the system prompt.

Each chat becomes one `TrainSequence` laid out exactly as the sampler would have produced it
(token in, token out), rendered by the policy's own prompt code (`policy.prompts`: the model's
chat template, its tool format, control-token text kept as text):

    ids  = enc(prompt_1) + enc(content_1) + [eot] + enc(between_1_2) + enc(content_2) + [eot] ...
    mask =    False...      True...         True      False...            True...        True

`prompt_1` is the template's text up to and including the assistant header; `content_k` is the
text the template writes for assistant message k, up to the end-of-turn token `eot`; the text the
template adds after `eot` (SmolLM2: a newline), the next user turn and the next assistant header
are context. This is the sequence the RL sampler records for the same conversation (each turn
encoded on its own, the end-of-turn token sampled as one id), so an SFT adapter and an RL adapter
are trained on the same token layout. A template that rewrites earlier turns is refused.

Training reuses the RL path: sequences are batched by `core.batching.micro_batches` (the chats'
common system prompt and tool list run once per micro-batch), logprobs come from `core.forward`,
the step's span is RL's (`training.step.gradient_step`), checkpoints are saved by RL's
`training.checkpoint.save_if_due` under the same `[checkpoint]` section (so `grooves export`,
`grooves serve --adapter`, `grooves adapters list` and the registry treat an SFT run like an RL
run), and the run file's `task` validates the adapter as `grooves train` does
(`training.evaluate.evaluate`, the same `[validation]` section).

An RL run file's `[sft]` stage is this, run before RL into `<output_dir>/sft` (`run_stage`).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from grooves.config import AdamWConfig, CheckpointConfig, LoggingConfig, RolloutConfig
from grooves.config.base import ConfigError, dump
from grooves.config.check import init_adapter_problem
from grooves.config.run import RunConfig
from grooves.config.sft import SftConfig
from grooves.core.batching import micro_batches
from grooves.core.forward import shared_prefix_logprobs, token_logprobs
from grooves.core.tokenize import TrainSequence
from grooves.policy import policy_for
from grooves.policy.base import Policy
from grooves.policy.prompts import PromptState
from grooves.policy.tool_format import turn_problem
from grooves.rollouts.handle import ModelHandle
from grooves.serve.app import inprocess_client
from grooves.tasks import Task, load_task
from grooves.training.checkpoint import (
    TrainState,
    latest_checkpoint,
    load_checkpoint,
    load_with_fallback,
    save_if_due,
    seed_everything,
)
from grooves.training.cost import HEARTBEAT_S, sft_plan_line, sft_steps, validates_at
from grooves.training.data import ScenarioStream
from grooves.training.evaluate import evaluate
from grooves.training.memory import pair_tokens
from grooves.training.optim import adamw, lr_scheduler
from grooves.training.runlog import RunFolderError, RunLog, StepProgress, show_bars
from grooves.training.step import gradient_step
from grooves.training.trackers import start_trackers


# ---- chats -> sequences --------------------------------------------------------------------
class ChatError(ValueError):
    """A chat that cannot be trained on; the message names the line and the message index."""


def read_chats(path: str | Path) -> list[dict[str, Any]]:
    """Chats of a JSONL file, each checked to have messages with roles and an assistant turn."""
    chats = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            chat = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ChatError(f"{where}: not valid JSON ({exc.msg})") from None
        messages = chat.get("messages") if isinstance(chat, dict) else None
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ChatError(f'{where}: expected {{"messages": [{{"role": ..., "content": ...}}, ...]}}')
        if not any(m["role"] == "assistant" for m in messages):
            raise ChatError(f"{where}: no assistant message, so nothing to train on")
        chats.append(
            {
                "messages": messages,
                "tools": chat.get("tools"),
                "line": lineno,
                "scenario_id": chat.get("scenario_id"),
            }
        )
    if not chats:
        raise ChatError(f"{path}: no chats")
    return chats


def chat_to_sequence(
    prompts: PromptState, messages: list[dict[str, Any]], tools=None, *, where: str = "chat"
) -> TrainSequence:
    """One chat as ids + a mask that is True exactly on assistant content and end-of-turn tokens.

    The text is the policy's own rendering (`PromptState.template_text` and `encode`, as the sampler
    renders prompts), so control-token text inside a message stays text here too. Each assistant
    turn must parse back, with the policy's tool format, to the tool calls and content it holds
    (`tool_format.turn_problem`); a turn that does not is refused with its place in `where`."""
    tokenizer, guard = prompts.tokenizer, prompts.guard
    eos_texts = {i: tokenizer.decode([i], skip_special_tokens=False) for i in prompts.eos_token_ids}
    ids: list[int] = []
    mask: list[bool] = []
    consumed = ""  # the template text already turned into ids
    prompt_len = None
    turn = 0
    for k, message in enumerate(messages):
        if message.get("role") != "assistant":
            if message.get("tool_calls"):
                raise ChatError(
                    f"{where}, message {k}: a {message.get('role')} message with tool_calls; only assistant turns call tools"
                )
            continue
        turn += 1
        prompt = prompts.template_text(messages[:k], tools, add_generation_prompt=True)
        upto = prompts.template_text(messages[: k + 1], tools, add_generation_prompt=False)
        if not prompt.startswith(consumed) or not upto.startswith(prompt):
            raise ChatError(
                f"{where}, message {k}: the chat template rewrites earlier turns (not append-only); cannot mask it"
            )
        found = {i: guard.find(upto, text, len(prompt)) for i, text in eos_texts.items()}
        ends = [(at, i) for i, at in found.items() if at >= 0]
        if not ends:
            raise ChatError(
                f"{where}, message {k}: the template wrote no end-of-turn token {sorted(eos_texts.values())} after it"
            )
        end, eos_id = min(ends)
        problem = turn_problem(prompts.tool_format, guard.unmark(upto[len(prompt) : end]), message, tools)
        if problem:
            raise ChatError(f"{where}: assistant turn {turn} (message {k}): {problem}")
        context, content = prompts.encode(prompt[len(consumed) :]), prompts.encode(upto[len(prompt) : end])
        prompt_len = len(ids) + len(context) if prompt_len is None else prompt_len
        ids += context + content + [eos_id]
        mask += [False] * len(context) + [True] * (len(content) + 1)
        consumed = upto[: end + len(eos_texts[eos_id])]
    return TrainSequence(ids, mask, [0.0] * len(ids), advantage=1.0, group_id=0, prompt_len=prompt_len or 0)


# ---- training ------------------------------------------------------------------------------
def sft_step(policy: Policy, optimizer, seqs: list[TrainSequence], config: SftConfig) -> dict[str, float]:
    """One optimizer step: token-mean NLL of the assistant tokens of `seqs`, micro-batched.

    As in RL (`training.step.gradient_step`), the update is this step's gradient alone: gradients an
    earlier caller left in `.grad` are zeroed first."""
    opt = config.optim
    num_tokens = sum(s.num_sampled for s in seqs)
    pairs = pair_tokens(policy.model, checkpointing=False)  # attention's T x T memory
    batches = micro_batches(seqs, opt, policy.tokenizer.pad_token_id or 0, pair_cost=pairs)
    nll_sum = 0.0
    params = [p for p in policy.model.parameters() if p.requires_grad]
    with gradient_step(policy, optimizer) as model:
        for batch, prefix_len in batches:
            if prefix_len:  # the chats' common start (system prompt, tools) once
                lp, _ = shared_prefix_logprobs(model, batch, prefix_len, 1.0)  # [B, T]
            else:
                lp, _ = token_logprobs(model, batch, 1.0)  # [B, T]
            mask = batch.sampled_mask.to(lp.device)  # [B, T]
            loss = -(lp * mask).sum() / num_tokens  # this micro-batch's share of the step's token mean
            loss.backward()
            nll_sum += float(-(lp.detach() * mask).sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(params, opt.grad_clip)
        optimizer.step()
    return {
        "loss": nll_sum / max(num_tokens, 1),
        "assistant_tokens": float(num_tokens),
        "grad_norm": float(grad_norm),
        "micro_batches": float(len(batches)),
    }


def _policy(config: SftConfig) -> Policy:
    return policy_for(config.model, config.lora, seed=config.seed, served_name=config.name)


def load_sequences(path: str | Path, policy: Policy) -> list[TrainSequence]:
    """The chats of a JSONL file as training sequences, rendered as `policy` renders prompts."""
    return [
        chat_to_sequence(policy.prompts, c["messages"], c["tools"], where=f"{path}:{c['line']}")
        for c in read_chats(path)
    ]


def _checkpoint_to_resume(run_dir: Path, resume: bool) -> Path | None:
    """The checkpoint to continue (None for a fresh run); checked before the model loads."""
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if checkpoint is None and resume:
        raise FileNotFoundError(
            f"--resume: no checkpoint in {run_dir / 'checkpoints'}; start without --resume"
        )
    return checkpoint


def _restore(checkpoint: Path | None, policy, optimizer, stream, log: RunLog) -> TrainState:
    state = TrainState(step=0, data_position=0)
    if checkpoint is not None:  # one that fails to load: the one before it, named on stderr
        checkpoint, state = load_with_fallback(
            checkpoint,
            lambda path: load_checkpoint(path, policy.model, optimizer, policy.generator),
            _say,
        )
        stream.position = state.data_position
        print(f"resuming {log.dir} from step {state.step} ({checkpoint})", flush=True)
    log.truncate_after(state.step if checkpoint is not None else -1)
    return state


class _Validation:
    """The adapter scored on `config.task`'s validation split as `grooves train` scores it
    (`evaluate`, seeded from `seed + 1` and the step), through an in-process client of the policy;
    nothing when the run file names no task."""

    def __init__(self, config: SftConfig, policy: Policy):
        v = config.validation
        self.config = config
        self.task = load_task(config.task, config.task_options) if config.task else None
        self.handle = None
        if self.task is not None:
            max_tokens = v.max_tokens or RolloutConfig().max_tokens
            client = inprocess_client(policy)
            self.handle = ModelHandle(
                client, policy.served_name, v.temperature, 1.0, max_tokens, seed=config.seed + 1
            )

    def due(self, step: int, steps: int) -> bool:
        return self.task is not None and validates_at(self.config.validation, step, steps)

    async def __call__(self, step: int) -> tuple[dict[str, float], list]:
        v = self.config.validation
        assert self.task is not None and self.handle is not None  # called only when `due`
        return await evaluate(
            self.task,
            self.handle,
            scenarios=v.scenarios,
            samples=v.samples,
            temperature=v.temperature,
            seed=self.config.seed + 1,
            step=step,
            progress=show_bars(self.config.logging.progress),
            heartbeat=None if show_bars(self.config.logging.progress) else HEARTBEAT_S,
        )

    async def aclose(self) -> None:
        if self.handle is not None:
            await self.handle.client.close()


async def run_sft(config: SftConfig, *, resume: bool = False) -> Path:
    """Train an adapter on `config.data`; returns the run folder (same layout as an RL run)."""
    problem = init_adapter_problem(config)  # another base model or LoRA shape: one line, before loading
    if problem:
        raise ConfigError(problem)
    run_dir = Path(config.output_dir)
    checkpoint = _checkpoint_to_resume(run_dir, resume)
    log = RunLog(run_dir)
    config_toml = dump(config)
    (run_dir / "config.toml").write_text(config_toml)
    seed_everything(config.seed)
    policy = _policy(config)
    seqs = load_sequences(config.data, policy)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = adamw(
        params, lr=config.optim.lr, betas=config.optim.betas, weight_decay=config.optim.weight_decay
    )
    stream = ScenarioStream(seqs, config.seed)  # a fresh seeded order each epoch, resumable by position
    steps = sft_steps(config, len(seqs))
    state = _restore(checkpoint, policy, optimizer, stream, log)
    log.trackers = start_trackers(config.logging, config.name, run_dir, config_toml, resumed_at=state.step)
    scheduler = lr_scheduler(optimizer, config.optim, steps, done=state.step)
    validate = _Validation(config, policy)
    held = len(validate.task.scenarios("validation")) if validate.task is not None else None
    _say(sft_plan_line(config, len(seqs), steps, held, start=state.step))
    progress = StepProgress(config.logging.progress, config.name, steps, state.step)
    try:
        if validate.task is not None and state.step == 0 and config.validation.at_start:
            val, groups = await validate(0)
            log.log({"step": 0, **val})
            log.samples(0, groups, name="validation")
        while state.step < steps:
            step, t0 = state.step + 1, time.perf_counter()
            batch = [s for _, s in stream.take(config.batch_size)]
            lr = optimizer.param_groups[0]["lr"]  # the rate this step's update uses
            metrics: dict[str, Any] = {"step": step, **sft_step(policy, optimizer, batch, config), "lr": lr}
            scheduler.step()
            policy.adapters.bump()
            if validate.due(step, steps):
                val, groups = await validate(step)
                metrics.update(val)
                log.samples(step, groups, name="validation")
            metrics["seconds_step"] = time.perf_counter() - t0
            state = TrainState(step=step, data_position=stream.position)
            log.log(metrics)
            save_if_due(run_dir, state, policy, optimizer, config_toml, config.checkpoint, last=steps)
            progress.step(metrics, loss=f"{metrics['loss']:.4f}")
    finally:
        progress.close()
        log.close()
        await validate.aclose()
    return run_dir


def sft(config: SftConfig, *, resume: bool = False) -> Path:
    """Synchronous entry point: `grooves.training.sft.sft(load_sft_config("sft.toml"))`."""
    return asyncio.run(run_sft(config, resume=resume))


# ---- the [sft] stage of an RL run file ---------------------------------------------------------
async def run_stage(
    config: RunConfig, task: Task, run_dir: Path, *, resume: bool, overwrite: bool
) -> RunConfig:
    """Run an RL run file's `[sft]` stage into `<run_dir>/sft`; returns the config with RL starting
    from its adapter (`model.init_adapter`).

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
    assert stage is not None  # the run loop starts a stage only for a run file with [sft]
    try:
        overlap = validation_overlap(read_chats(stage.data), held_out(task))
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


def held_out(task: Task) -> list[dict[str, Any]]:
    """The scenarios no training data may show: validation, and test where the task has that split."""
    held = list(task.scenarios("validation"))
    try:
        held += task.scenarios("test")
    except ValueError:  # a task of train and validation only (capitals)
        pass
    return held


def stage_config(config: RunConfig, folder: Path) -> SftConfig:
    """The `grooves sft` config of a run file's `[sft]` stage: its data and steps, the run's
    `[model]` and `[lora]` (so RL can continue the adapter), seed, micro-batching and progress."""
    stage, opt = config.sft, config.optim
    if stage is None:
        raise ValueError("the run file has no [sft] section")
    return SftConfig(
        name=f"{config.name}-sft",
        output_dir=str(folder),
        seed=config.seed,
        data=stage.data,
        batch_size=stage.batch_size,
        epochs=stage.epochs,
        steps=stage.steps,
        model=config.model,
        lora=config.lora,
        optim=AdamWConfig(
            lr=stage.lr,
            betas=opt.betas,
            grad_clip=opt.grad_clip,
            **({"micro_batch_tokens": opt.micro_batch_tokens} if opt.micro_batch_tokens else {}),
            share_prefix=opt.share_prefix,
            packing=opt.packing,
        ),
        logging=LoggingConfig(progress=config.logging.progress),
        checkpoint=CheckpointConfig(every=stage.checkpoint_every),
    )


def validation_overlap(chats: list[dict[str, Any]], validation: list[dict[str, Any]]) -> str | None:
    """Where a chat demonstrates a validation scenario (by its `scenario_id` or its user request),
    as `line N: ...`; None when none does. Training on validation scenarios would make validation
    measure recall instead of what was learned."""
    ids = {str(s["id"]): s for s in validation if s.get("id") is not None}
    prompts = {s["prompt"]: s for s in validation if isinstance(s.get("prompt"), str)}
    for chat in chats:
        hit = ids.get(str(chat.get("scenario_id"))) if chat.get("scenario_id") is not None else None
        for m in chat["messages"]:
            if hit is None and m.get("role") == "user" and m.get("content") in prompts:
                hit = prompts[m["content"]]
        if hit is not None:
            return (
                f"line {chat['line']}: demonstrates {hit.get('split', 'validation')} scenario "
                f"{hit.get('id', hit.get('prompt'))!r}"
            )
    return None


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
