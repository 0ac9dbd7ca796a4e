"""Supervised fine-tuning of the same LoRA adapter on example chats (`grooves sft`).

Data is JSONL, one OpenAI-style chat per line: `{"messages": [...], "tools": [...]}` (tools
optional). The loss is the mean negative log-likelihood of the assistant's tokens only, so the
adapter learns to write the answers, not to predict the user's questions or the system prompt.

Each chat becomes one `TrainSequence` laid out exactly as the sampler would have produced it
(token in, token out), rendered with the model's own chat template and tool format:

    ids  = enc(prompt_1) + enc(content_1) + [eot] + enc(between_1_2) + enc(content_2) + [eot] ...
    mask =    False...      True...         True      False...            True...        True

`prompt_1` is the template's text up to and including the assistant header; `content_k` is the
text the template writes for assistant message k, up to the end-of-turn token `eot`; the text the
template adds after `eot` (SmolLM2: a newline), the next user turn and the next assistant header
are context. This is the sequence the RL sampler records for the same conversation (each turn
encoded on its own, the end-of-turn token sampled as one id), so an SFT adapter and an RL adapter
are trained on the same token layout. A template that rewrites earlier turns is refused, and so
is an assistant turn that the policy's tool format would not parse back to the calls it holds.

Training reuses the RL path: sequences are batched by `trainer.micro_batches` (the chats' common
system prompt and tool list run once per micro-batch), logprobs come from `forward`, checkpoints from `checkpoint.save_checkpoint` (so `grooves export`,
`grooves serve --adapter`, `grooves adapters list` and the registry treat an SFT run like an RL
run), and an optional task validates the adapter the same way `grooves train` does.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grooves.checkpoint import TrainState, latest_checkpoint, load_checkpoint, save_checkpoint
from grooves.config import ConfigError, LoraConfig, ModelConfig, _format, _set_nested
from grooves.forward import shared_prefix_logprobs, token_logprobs
from grooves.lora_addmm import addmm_lora
from grooves.optim import adamw
from grooves.policy.control_tokens import ControlTextGuard
from grooves.policy.tool_format import turn_problem
from grooves.runlog import RunLog
from grooves.tokenize import TrainSequence
from grooves.trainer import micro_batches


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SftOptimConfig(_Section):
    lr: float = Field(1e-4, gt=0)
    """AdamW learning rate. SFT on LoRA tolerates ~1e-4..2e-4; RL wants less (its targets move)."""
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = Field(1.0, gt=0)
    micro_batch_tokens: int = Field(4096, ge=16)
    """Tokens per forward/backward (memory bound); a step accumulates micro-batches into one update."""
    share_prefix: bool = True
    """Run the step's common leading tokens (an environment's system prompt and tool list, the
    same in every demonstration) once per micro-batch, as RL does for a group's prompt: the same
    gradient for a fraction of the tokens. Falls back to `packing`."""
    packing: bool = True
    """Pack several chats per row (block-diagonal attention) instead of padding to the longest."""


class SftValidationConfig(_Section):
    task: str | None = None
    """A task (as in `grooves train`) whose validation split scores the adapter; unset: no validation."""
    task_options: dict[str, str | int | float | bool] = {}
    every: int = Field(0, ge=0)
    """Validate every K steps (0 = only before the first and after the last step)."""
    scenarios: int = Field(32, ge=1)
    temperature: float = Field(0.7, ge=0, le=2)
    max_tokens: int = Field(64, ge=1)


class SftLoggingConfig(_Section):
    checkpoint_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(3, ge=1)
    progress: bool = True


class SftConfig(_Section):
    name: str = "sft"
    output_dir: str = "runs/sft"
    seed: int = 0
    data: str
    """JSONL file of chats: {"messages": [...], "tools": [...]} per line."""
    batch_size: int = Field(8, ge=1)
    """Chats per optimizer step."""
    epochs: float = Field(1.0, gt=0)
    """Passes over the data; ignored when `steps` is set."""
    steps: int | None = Field(None, ge=1)
    """Optimizer steps; default ceil(epochs x chats / batch_size)."""
    model: ModelConfig = ModelConfig()
    lora: LoraConfig = LoraConfig()
    optim: SftOptimConfig = SftOptimConfig()
    validation: SftValidationConfig = SftValidationConfig()
    logging: SftLoggingConfig = SftLoggingConfig()


def parse_sft_config(data: dict) -> SftConfig:
    try:
        return SftConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format(exc)) from None


def load_sft_config(path: str | Path | None, overrides: dict | None = None) -> SftConfig:
    """Read an SFT run file (or start from defaults when `path` is None); `overrides` win."""
    import tomllib

    data: dict = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such run file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    for key, value in (overrides or {}).items():
        _set_nested(data, key.split("."), value)
    return parse_sft_config(data)


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
        chats.append({"messages": messages, "tools": chat.get("tools"), "line": lineno})
    if not chats:
        raise ChatError(f"{path}: no chats")
    return chats


def _render(tokenizer, tool_format, guard, messages, tools, add_generation_prompt: bool) -> str:
    msgs, native_tools = tool_format.template_messages(messages, tools)
    return tokenizer.apply_chat_template(
        guard.mark(msgs), tools=guard.mark(native_tools), tokenize=False, add_generation_prompt=add_generation_prompt
    )


def chat_to_sequence(
    tokenizer, tool_format, messages: list[dict[str, Any]], tools=None, *, eos_token_ids: set[int], where: str = "chat",
    guard: ControlTextGuard | None = None,
) -> TrainSequence:
    """One chat as ids + a mask that is True exactly on assistant content and end-of-turn tokens.

    Rendered and encoded as the sampler renders a prompt (`TransformersPolicy.render`): control-token
    text inside messages stays text (`guard`, built from `tokenizer` if not given). Each assistant
    turn must parse back, with the policy's tool format, to the tool calls and content it holds
    (`tool_format.turn_problem`); a turn that does not is refused with its place in `where`.
    """
    guard = guard or ControlTextGuard(tokenizer)
    eos_texts = {i: tokenizer.decode([i], skip_special_tokens=False) for i in eos_token_ids}
    ids: list[int] = []
    mask: list[bool] = []
    consumed = ""  # the template text already turned into ids
    prompt_len = None
    turn = 0
    for k, message in enumerate(messages):
        if message.get("role") != "assistant":
            if message.get("tool_calls"):
                raise ChatError(f"{where}, message {k}: a {message.get('role')} message with tool_calls; only assistant turns call tools")
            continue
        turn += 1
        prompt = _render(tokenizer, tool_format, guard, messages[:k], tools, add_generation_prompt=True)
        upto = _render(tokenizer, tool_format, guard, messages[: k + 1], tools, add_generation_prompt=False)
        if not prompt.startswith(consumed) or not upto.startswith(prompt):
            raise ChatError(f"{where}, message {k}: the chat template rewrites earlier turns (not append-only); cannot mask it")
        found = {i: guard.find_written(upto, text, len(prompt)) for i, text in eos_texts.items()}
        ends = [(at, i) for i, at in found.items() if at >= 0]
        if not ends:
            raise ChatError(f"{where}, message {k}: the template wrote no end-of-turn token {sorted(eos_texts.values())} after it")
        end, eos_id = min(ends)
        problem = turn_problem(tool_format, guard.unmark(upto[len(prompt) : end]), message, tools)
        if problem:
            raise ChatError(f"{where}: assistant turn {turn} (message {k}): {problem}")
        context, content = guard.encode(prompt[len(consumed) :]), guard.encode(upto[len(prompt) : end])
        prompt_len = len(ids) + len(context) if prompt_len is None else prompt_len
        ids += context + content + [eos_id]
        mask += [False] * len(context) + [True] * (len(content) + 1)
        consumed = upto[: end + len(eos_texts[eos_id])]
    return TrainSequence(ids, mask, [0.0] * len(ids), advantage=1.0, group_id=0, prompt_len=prompt_len or 0)


# ---- training ------------------------------------------------------------------------------
def sft_step(policy, optimizer, seqs: list[TrainSequence], config: SftConfig) -> dict[str, float]:
    """One optimizer step: token-mean NLL of the assistant tokens of `seqs`, micro-batched."""
    model, opt = policy.model, config.optim
    num_tokens = sum(s.num_sampled for s in seqs)
    batches = micro_batches(seqs, opt, policy.tokenizer.pad_token_id or 0)
    nll_sum = 0.0
    with policy.lock, addmm_lora(model):
        model.train()
        for batch, prefix_len in batches:
            if prefix_len:
                lp, _ = shared_prefix_logprobs(model, batch, prefix_len, 1.0)  # [B, T]
            else:
                lp, _ = token_logprobs(model, batch, 1.0)  # [B, T]
            mask = batch.sampled_mask.to(lp.device)  # [B, T]
            loss = -(lp * mask).sum() / num_tokens  # this micro-batch's share of the step's token mean
            loss.backward()
            nll_sum += float(-(lp.detach() * mask).sum())
        params = [p for p in model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, opt.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.eval()
    return {"loss": nll_sum / max(num_tokens, 1), "assistant_tokens": float(num_tokens), "grad_norm": float(grad_norm), "micro_batches": float(len(batches))}


async def _validate(task, handle, config: SftConfig, step: int) -> tuple[dict[str, float], list]:
    from grooves.trajectory import gather

    v = config.validation
    groups = await gather(
        task.rollout, handle, task.scenarios("validation")[: v.scenarios], 1, max_failure_fraction=1.0,
        progress=config.logging.progress, description=f"validation @ {step}", seed_key=(step,),
    )  # fmt: skip
    trajs = [t for g in groups for t in g.ok]
    nan = float("nan")
    return {
        "val/reward_mean": statistics.fmean(t.reward for t in trajs) if trajs else nan,
        "val/success_rate": statistics.fmean(t.metrics.get("success", 0.0) for t in trajs) if trajs else nan,
    }, groups


def _policy(config: SftConfig):
    from grooves.policy.transformers_policy import LoraSettings, TransformersPolicy

    lora = LoraSettings(config.lora.rank, config.lora.alpha, config.lora.dropout, tuple(config.lora.target_modules))
    return TransformersPolicy(
        config.model.base_model, lora=lora, dtype=config.model.dtype, device=config.model.device,
        tool_format=config.model.tool_format, seed=config.seed, served_name=config.name,
        merge_for_sampling=config.model.merge_lora_for_sampling, reuse_freed_memory=config.model.reuse_freed_memory,
        fused_decode=config.model.fused_decode, matmul_forms=config.model.matmul_forms,
    )  # fmt: skip


def load_sequences(path: str | Path, policy) -> list[TrainSequence]:
    """The chats of a JSONL file as training sequences for `policy`'s tokenizer and chat template."""
    guard = ControlTextGuard(policy.tokenizer)
    return [
        chat_to_sequence(policy.tokenizer, policy.tool_format, c["messages"], c["tools"], eos_token_ids=policy.eos_token_ids,
                         where=f"{path}:{c['line']}", guard=guard)
        for c in read_chats(path)
    ]  # fmt: skip


def _restore(run_dir: Path, resume: bool, policy, optimizer, stream, log: RunLog) -> TrainState:
    checkpoint = latest_checkpoint(run_dir) if resume else None
    if checkpoint is None and resume:
        raise FileNotFoundError(f"--resume: no checkpoint in {run_dir / 'checkpoints'}; start without --resume")
    state = TrainState(step=0, data_position=0)
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, policy.model, optimizer, policy.generator)
        stream.position = state.data_position
    log.truncate_after(state.step if checkpoint is not None else -1)
    return state


def _validation_handle(config: SftConfig, policy):
    """(task, model handle) for validation, or (None, None) when no validation task is set."""
    from grooves.policy.handle import ModelHandle
    from grooves.server import inprocess_client
    from grooves.tasks import load_task

    v = config.validation
    if not v.task:
        return None, None
    handle = ModelHandle(inprocess_client(policy), policy.served_name, v.temperature, 1.0, v.max_tokens, seed=config.seed + 1)
    return load_task(v.task, v.task_options), handle


async def run_sft(config: SftConfig, *, resume: bool = False) -> Path:
    """Train an adapter on `config.data`; returns the run folder (same layout as an RL run)."""
    import tomli_w
    from tqdm.auto import tqdm

    from grooves.trainer import ScenarioStream, seed_everything

    run_dir = Path(config.output_dir)
    log = RunLog(run_dir)
    config_toml = tomli_w.dumps(config.model_dump(mode="json", exclude_none=True))
    (run_dir / "config.toml").write_text(config_toml)
    seed_everything(config.seed)
    policy = _policy(config)
    seqs = load_sequences(config.data, policy)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = adamw(params, lr=config.optim.lr, betas=config.optim.betas, weight_decay=config.optim.weight_decay)
    stream = ScenarioStream(seqs, config.seed)  # a fresh seeded order each epoch, resumable by position
    steps = config.steps or math.ceil(config.epochs * len(seqs) / config.batch_size)
    state = _restore(run_dir, resume, policy, optimizer, stream, log)
    task, handle = _validation_handle(config, policy)
    if task and state.step == 0:
        val, groups = await _validate(task, handle, config, 0)
        log.log({"step": 0, **val})
        log.samples(0, groups, name="validation")
    bar = tqdm(total=steps, initial=state.step, desc=config.name, disable=not config.logging.progress, dynamic_ncols=True)
    while state.step < steps:
        step, t0 = state.step + 1, time.perf_counter()
        batch = [s for _, s in stream.take(config.batch_size)]
        metrics: dict[str, Any] = {"step": step, **sft_step(policy, optimizer, batch, config), "lr": config.optim.lr}
        policy.bump_version()
        if task and ((config.validation.every and step % config.validation.every == 0) or step == steps):
            val, groups = await _validate(task, handle, config, step)
            metrics.update(val)
            log.samples(step, groups, name="validation")
        metrics["seconds_step"] = time.perf_counter() - t0
        state = TrainState(step=step, data_position=stream.position)
        log.log(metrics)
        if step % config.logging.checkpoint_every == 0 or step == steps:
            save_checkpoint(run_dir, state, policy.model, optimizer, policy.generator, config_toml, config.logging.keep_checkpoints)
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['loss']:.4f}")
    bar.close()
    if handle is not None:
        await handle.client.close()
    return run_dir


def sft(config: SftConfig, *, resume: bool = False) -> Path:
    """Synchronous entry point: `grooves.sft.sft(load_sft_config("sft.toml"))`."""
    return asyncio.run(run_sft(config, resume=resume))
