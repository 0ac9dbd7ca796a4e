"""The transformers + peft policy: one model that both samples and trains.

On one machine the sampler and the trainer share the same `PeftModel` object, so a training
step's new adapter weights are live for the next request without copying anything ("hot-swap"
is a version bump). A lock keeps a sampling batch and an optimizer step from touching the
weights at the same time.

Prompts are rendered with the model's own chat template (tools via the family's `ToolFormat`);
control-token text inside messages and tools stays text (`policy/control_tokens.py`).
For multi-turn agents, each completion we return is remembered with the exact token ids of its
prompt and its sample; when a later request continues that conversation, its prompt is built
from those ids plus the newly rendered suffix. The prompt then extends the earlier one token for
token, so the trainer can score the whole conversation as one sequence and never trains on a
re-tokenization that differs from what was sampled.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import torch

from grooves.config import MatmulForms
from grooves.models import resolve_model
from grooves.policy import allocator
from grooves.policy.control_tokens import ControlTextGuard
from grooves.policy.decode import MatmulPlan
from grooves.policy.merged import MergedWeights
from grooves.policy.output_head import PlannedHead
from grooves.policy.sampling import Completion, SamplingParams, sample
from grooves.policy.tool_calls import ParsedOutput, ToolCallCounters
from grooves.policy.tool_format import ToolFormat, tool_format_for

log = logging.getLogger("grooves.policy")


@dataclass
class LoraSettings:
    """LoRA adapter shape. rank 1 works; alpha/rank sets the update scale."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ContextOverflow(ValueError):
    """The prompt plus max_tokens does not fit in the model's context."""


def _key(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


class TransformersPolicy:
    """Sampling (and, with `lora`, training) on a Hugging Face causal LM."""

    def __init__(
        self,
        base_model: str,
        *,
        lora: LoraSettings | None = None,
        adapter_path: str | Path | None = None,
        dtype: str = "float32",
        device: str = "cpu",
        tool_format: str | None = None,
        max_context: int | None = None,
        seed: int = 0,
        served_name: str | None = None,
        attn_implementation: str = "sdpa",
        merge_for_sampling: bool = True,
        reuse_freed_memory: bool = True,
        fused_decode: bool = True,
        matmul_forms: MatmulForms = "timed_head",
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if reuse_freed_memory and torch.device(device).type == "cpu":
            allocator.reuse_freed_memory()  # before the model's weights and its first step's temporaries

        path = resolve_model(base_model)
        self.base_model = base_model
        self.served_name = served_name or base_model
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), attn_implementation=attn_implementation
        ).to(device)
        model.eval()
        if adapter_path is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter_path), is_trainable=lora is not None)
        elif lora is not None:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(
                model,
                LoraConfig(
                    r=lora.rank,
                    lora_alpha=lora.alpha,
                    lora_dropout=lora.dropout,
                    target_modules=list(lora.target_modules),
                    task_type="CAUSAL_LM",
                ),
            )
        self.model = model
        self.trainable = lora is not None
        self._own_adapter = hasattr(model, "peft_config")
        """The policy's own weights include an adapter (peft's `default`); else they are the base alone."""
        self._merged = MergedWeights(model) if self._own_adapter and merge_for_sampling else None
        """The own adapter folded into copies of the base weights, for sampling (see `policy/merged.py`)."""
        self.fused_decode = fused_decode
        """Decode Llama-family models with the sampler's own lean forward (see `policy/decode.py`)."""
        if matmul_forms not in get_args(MatmulForms):
            raise ValueError(f"matmul_forms={matmul_forms!r}: use one of {get_args(MatmulForms)} (see ModelConfig.matmul_forms)")
        self._plan = MatmulPlan() if matmul_forms == "timed" else None
        """That forward's matmul form per row count, from timed decode steps; None: `x W^T`, untimed."""
        self._head = PlannedHead() if matmul_forms != "fixed" else None
        """The output head's matmul form per decode row count, timed once (see `policy/output_head.py`); None: the head as it is."""
        self.device = device
        self.tool_format: ToolFormat = tool_format_for(tool_format, self.tokenizer.chat_template, self.tokenizer)
        self.tool_calls = ToolCallCounters()
        """Calls read from sampled text, and call-like blocks kept as text because they did not parse."""
        self._grammars = None
        """The grammar compiler for constrained decoding, built on first use (`constraint_for`)."""
        self._guard = ControlTextGuard(self.tokenizer)
        """Keeps `<|im_end|>` and other control-token text in messages and tools from becoming control tokens."""
        self.max_context = max_context or int(getattr(model.config, "max_position_embeddings", 2048))
        self.eos_token_ids = self._eos_ids()
        self.lock = threading.RLock()
        self.generator = torch.Generator().manual_seed(seed)
        self.adapter_version = 0
        self._records: OrderedDict[str, tuple[list[int], list[int], str]] = OrderedDict()
        self._max_records = 20_000

    def _eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        gen = getattr(self.model, "generation_config", None)
        extra = getattr(gen, "eos_token_id", None)
        if isinstance(extra, int):
            ids.add(extra)
        elif isinstance(extra, list):
            ids.update(extra)
        return {i for i in ids if i is not None}

    # ---- prompts -------------------------------------------------------------------------
    def _template_text(self, messages, tools, add_generation_prompt: bool) -> str:
        """The rendered prompt, with control-token text from the request marked (`_encode` keeps it text)."""
        msgs, native_tools = self.tool_format.template_messages(messages, tools)
        return self.tokenizer.apply_chat_template(
            self._guard.mark(msgs), tools=self._guard.mark(native_tools), tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    def _encode(self, text: str) -> list[int]:
        return self._guard.encode(text)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Token ids of the prompt, reusing the exact ids of earlier turns we sampled."""
        full = self._template_text(messages, tools, add_generation_prompt=True)
        for k in range(len(messages) - 1, -1, -1):
            if messages[k].get("role") != "assistant":
                continue
            record = self._records.get(self._record_key(messages[: k + 1], tools))
            if record is None:
                continue
            prompt_ids, completion_ids, _ = record
            upto = self._template_text(messages[: k + 1], tools, add_generation_prompt=False)
            if full.startswith(upto) and completion_ids and completion_ids[-1] in self.eos_token_ids:
                # the template may write text after the end-of-turn token (SmolLM2: "\n"); the
                # sampled ids stop at that token, so the suffix starts right after it, not after `upto`
                eos_text = self.tokenizer.decode(completion_ids[-1:], skip_special_tokens=False)
                end = upto.rfind(eos_text)
                if end >= 0:
                    return prompt_ids + completion_ids + self._encode(full[end + len(eos_text) :])
            break
        return self._encode(full)

    @staticmethod
    def _normal_message(m: dict[str, Any]) -> dict[str, Any]:
        calls = [
            {"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m.get("tool_calls") or []
        ]
        return {"role": m.get("role"), "content": m.get("content") or "", "tool_calls": calls}

    def _record_key(self, messages, tools) -> str:
        context = [self._normal_message(m) if m.get("role") == "assistant" else m for m in messages]
        return _key({"messages": context, "tools": tools})

    def remember(self, messages, tools, assistant_message, prompt_ids, completion: Completion) -> None:
        """Keep the token ids behind an assistant message we return, for later turns."""
        key = self._record_key([*messages, assistant_message], tools)
        self._records[key] = (prompt_ids, completion.token_ids, completion.text)
        self._records.move_to_end(key)
        while len(self._records) > self._max_records:
            self._records.popitem(last=False)

    # ---- sampling --------------------------------------------------------------------------
    def check_fits(self, prompt_ids: list[int], max_tokens: int) -> None:
        if len(prompt_ids) + max_tokens > self.max_context:
            raise ContextOverflow(
                f"prompt has {len(prompt_ids)} tokens and max_tokens is {max_tokens}: "
                f"together {len(prompt_ids) + max_tokens} > the model's context of {self.max_context}; "
                "shorten the messages or lower max_tokens"
            )

    def generate(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        adapter: str | None = None,
        cancelled: Sequence[Callable[[], bool]] | None = None,
    ) -> list[list[Completion]]:
        """Sample completions for several prompts in one batch (blocking).

        `adapter` names an extra adapter loaded with `load_adapter`; None samples with the policy's
        own weights (its training or `adapter_path` adapter, or the base model if it has none).
        `cancelled[i]()` turning True drops prompt i's rows at the next decode step (see `sample`).
        """
        head = self._head.applied(self.model) if self._head is not None else contextlib.nullcontext()
        with self.lock, self._sampling_weights(adapter), head:
            was_training = self.model.training
            self.model.eval()
            try:
                return sample(
                    self.model, self.tokenizer, prompts, params, eos_token_ids=self.eos_token_ids,
                    generator=self.generator, fused=self.fused_decode, plan=self._plan, cancelled=cancelled,
                )
            finally:
                if was_training:
                    self.model.train()

    def parse(self, text: str, tools) -> ParsedOutput:
        """Tool calls in `text`; call-like blocks that do not parse stay in the content, counted and logged."""
        parsed = self.tool_format.parse(text, tools)
        self.tool_calls.parsed += len(parsed.tool_calls)
        self.tool_calls.unparsed += len(parsed.unparsed)
        for block in parsed.unparsed:
            log.warning("tool call kept as text (%s): %.200r", block.reason, block.text)
        return parsed

    def constraint_for(self, *, response_format=None, tools=None, tool_choice=None, parallel_tool_calls: bool = True):
        """The grammar a request's `response_format` / `tool_choice` imposes on its samples, or None.

        Raises `ConstraintError` (with the request field to name) for what cannot be compiled.
        """
        from grooves.policy.constraints import GrammarCompiler, request_grammar

        grammar = request_grammar(
            self.tool_format.syntax, response_format=response_format, tools=tools, tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls,
        )
        if grammar is None:
            return None
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer, self.eos_token_ids)
        return self._grammars.compile(grammar)

    # ---- extra adapters (multi-LoRA serving) -----------------------------------------------
    def load_adapter(self, path: str | Path, name: str) -> None:
        """Load a saved peft adapter beside the policy's own weights, frozen, under `name`."""
        from peft import PeftModel

        if not (Path(path) / "adapter_config.json").is_file():
            raise ValueError(f"{path}: no adapter_config.json; pass a folder saved by peft (e.g. checkpoints/step_N/adapter)")
        with self.lock, self._keep_requires_grad():
            try:
                if hasattr(self.model, "peft_config"):
                    self.model.load_adapter(str(path), adapter_name=name, is_trainable=False)
                else:  # the first adapter wraps the base model (in place: the base weights stay shared)
                    self.model = PeftModel.from_pretrained(self.model, str(path), adapter_name=name, is_trainable=False)
            except Exception:  # e.g. shapes of another base model: leave no half-loaded adapter behind
                if name in self.loaded_adapters():
                    self.unload_adapter(name)
                raise
            self.model.eval()

    def unload_adapter(self, name: str) -> None:
        """Free an adapter loaded with `load_adapter`."""
        with self.lock, self._keep_requires_grad():
            others = [n for n in self.loaded_adapters() if n != name]
            if self.model.active_adapter == name and others:
                self.model.set_adapter(others[0])  # peft would warn that the active adapter is gone
            self.model.delete_adapter(name)
            if not self._own_adapter and not self.model.peft_config:
                self.model = self.model.unload()  # back to the plain base model

    def loaded_adapters(self) -> list[str]:
        return list(getattr(self.model, "peft_config", {}))

    @contextlib.contextmanager
    def _keep_requires_grad(self):
        """peft's load/set/delete_adapter reset which adapter trains; the training adapter must keep training."""
        flags = [(p, p.requires_grad) for p in self.model.parameters()]
        try:
            yield
        finally:
            for p, flag in flags:  # parameters added meanwhile keep their own (frozen) setting
                p.requires_grad_(flag)

    @contextlib.contextmanager
    def _sampling_weights(self, adapter: str | None):
        """The weights a sampling batch runs on: the own adapter folded in where possible, else peft's layers."""
        if adapter is None and self._merged is not None and self._merged.supported:
            with self._keep_requires_grad(), self._merged.applied():
                yield
        else:
            with self._adapter_scope(adapter):
                yield

    @contextlib.contextmanager
    def _adapter_scope(self, adapter: str | None):
        """Sample with `adapter` (or the policy's own weights), then restore the active adapter."""
        if adapter is None:
            if self._own_adapter or not hasattr(self.model, "peft_config"):
                yield
            else:
                with self.model.disable_adapter():
                    yield
            return
        if adapter not in self.loaded_adapters():
            raise ValueError(f"adapter {adapter!r} is not loaded; loaded: {self.loaded_adapters()}")
        previous = self.model.active_adapter
        with self._keep_requires_grad():
            self.model.set_adapter(adapter)
        try:
            yield
        finally:
            with self._keep_requires_grad():
                self.model.set_adapter(previous)

    def bump_version(self) -> int:
        """Called by the trainer after each optimizer step: the adapter now live is this version."""
        self.adapter_version += 1
        return self.adapter_version

    @contextlib.contextmanager
    def training_phase(self):
        """The trainer's optimizer step runs inside this. Nothing to do here: sampler and trainer are
        one model. (The vLLM policy puts its engine to sleep here to free the GPU.)"""
        yield
