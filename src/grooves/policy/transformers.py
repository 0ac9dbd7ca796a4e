"""The transformers + peft policy: one model that both samples and trains.

On one machine the sampler and the trainer share the same `PeftModel` object, so a training
step's new adapter weights are live for the next request without copying anything ("hot-swap"
is a version bump). A lock keeps a sampling batch and an optimizer step from touching the
weights at the same time.

The policy composes its parts (see `policy.base.Policy`): `prompts` renders chats and keeps the
token records of multi-turn conversations, `adapters` holds the peft model with its own adapter's
version and the extra adapters served beside it, and `sampler` samples batches on it with the
CPU speed paths `fast` chooses (`policy/fast/`). `load_model` is shared with the vLLM backend,
which trains the same peft model.

`SharedBase` loads a base model once for several policies (the training service hosts one per
trainable model): each policy gets a module tree of its own, so its adapter, folded weights and
speed paths are its own, over the same weight tensors, and all of them take one lock.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from grooves.config import FastMode, LoraConfig, SamplerPrecision
from grooves.models import check_adapter_base, resolve_model
from grooves.policy import fast as speed
from grooves.policy.fast import FastPaths, FastSampling
from grooves.policy.loaded_adapters import PeftAdapters, peft_wrapping
from grooves.policy.prompts import PromptState, end_of_turn_ids
from grooves.policy.sampler import Sampler
from grooves.policy.sampling import Completion, SamplingParams


def _load_base(base_model: str, dtype: str, device: str, attn_implementation: str):
    """(model, tokenizer): the base model on `device` in eval mode, no adapter."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(base_model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    # transformers types `.to` through a wrapper whose __call__ takes the model as well
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype), attn_implementation=attn_implementation
    ).to(device)  # type: ignore[arg-type]
    model.eval()
    return model, tokenizer


class SharedBase:
    """A base model's weights, loaded once, under several policies that each add an adapter of their own.

    `module()` gives a policy its own copy of the module tree whose parameters are new `Parameter`
    objects over the same storage: peft wraps that tree's layers, the folded-LoRA path swaps its
    weights' `.data` for a sampling batch, and none of it reaches the other trees. Nothing writes
    into the base weights (training updates only adapter parameters), so sharing the storage is
    safe. The policies share `lock` too: one device, one sampling batch or optimizer step at a time.
    """

    def __init__(
        self,
        base_model: str,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        attn_implementation: str = "sdpa",
    ):
        self.base_model, self.dtype, self.device = base_model, dtype, device
        self._template, self.tokenizer = _load_base(base_model, dtype, device, attn_implementation)
        self.lock = threading.RLock()

    def module(self) -> torch.nn.Module:
        """A module tree of its own over the shared weight tensors (tied weights stay tied)."""
        aliases = {
            id(p): torch.nn.Parameter(p.data, requires_grad=p.requires_grad)
            for p in self._template.parameters()
        }
        return copy.deepcopy(self._template, memo=aliases)


def load_model(
    base_model: str,
    *,
    lora: LoraConfig | None = None,
    adapter_path: str | Path | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    attn_implementation: str = "sdpa",
    base: SharedBase | None = None,
):
    """(model, tokenizer): the base model on `device` in eval mode, wrapped by peft with a new
    trainable `lora` adapter, or with the saved one at `adapter_path` (trainable when `lora` is set).
    With `base`, its weights (and its dtype and device) instead of a new load of `base_model`."""
    if base is not None:
        model, tokenizer = base.module(), base.tokenizer
    else:
        model, tokenizer = _load_base(base_model, dtype, device, attn_implementation)
    if adapter_path is not None:
        from peft import PeftModel

        base_dir = resolve_model(base.base_model if base is not None else base_model)
        check_adapter_base(adapter_path, base_dir)  # another base's weights: a warning, see models.py
        with peft_wrapping():
            model = PeftModel.from_pretrained(model, str(adapter_path), is_trainable=lora is not None)
        local_base(model, base_dir)
    elif lora is not None:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model

        with peft_wrapping():
            model = get_peft_model(
                model,
                PeftLoraConfig(
                    r=lora.rank,
                    lora_alpha=lora.alpha,  # type: ignore[arg-type]  # peft says int; alpha / r takes a float
                    lora_dropout=lora.dropout,
                    target_modules=list(lora.target_modules),
                    task_type="CAUSAL_LM",
                ),
            )
    return model, tokenizer


def local_base(model, base_dir: str) -> None:
    """Name the folder the base weights were loaded from as the base of every adapter of `model`.

    A saved adapter records its base by Hub id (`models.record_adapter_base`), and peft keeps what it
    loaded: saving the adapter again (every checkpoint of an RL run started from an SFT adapter)
    then asks the Hub whether that id has a config.json, which on an offline machine is a failed
    network call and three "Unable to fetch remote file" warnings per save. With the local folder
    there peft finds the file on disk and makes no request; the checkpoint still records the Hub id
    (`record_adapter_base`) beside the path and weights hash."""
    if not Path(base_dir).is_dir():
        return  # a hub id: peft may look it up, as transformers did to load it
    for config in getattr(model, "peft_config", {}).values():
        config.base_model_name_or_path = str(base_dir)


class TransformersPolicy:
    """Sampling (and, with `lora`, training) on a Hugging Face causal LM."""

    def __init__(
        self,
        base_model: str,
        *,
        lora: LoraConfig | None = None,
        adapter_path: str | Path | None = None,
        dtype: str = "float32",
        device: str = "cpu",
        tool_format: str | None = None,
        max_context: int | None = None,
        seed: int = 0,
        served_name: str | None = None,
        attn_implementation: str = "sdpa",
        fast: FastMode | FastPaths = "on",
        base: SharedBase | None = None,
        sampler_precision: SamplerPrecision = "float32",
    ):
        """`base`: a `SharedBase` to build on (its weights, device and lock) instead of loading `base_model`."""
        if base is not None:
            base_model, device = base.base_model, base.device
        self.fast_paths = speed.fast_paths(fast)
        speed.before_load(self.fast_paths, device)
        self.base_model = base_model
        self.served_name = served_name or base_model
        model, self.tokenizer = load_model(
            base_model,
            lora=lora,
            adapter_path=adapter_path,
            dtype=dtype,
            device=device,
            attn_implementation=attn_implementation,
            base=base,
        )
        self.trainable = lora is not None
        self.device = device
        self.lock = base.lock if base is not None else threading.RLock()
        self.generator = torch.Generator().manual_seed(seed)
        self.adapters = PeftAdapters(model, self.lock)
        self.prompts = PromptState(
            self.tokenizer,
            tool_format=tool_format,
            eos_token_ids=end_of_turn_ids(self.tokenizer, model),
            max_context=max_context or int(getattr(model.config, "max_position_embeddings", 2048)),
        )
        self.sampler = Sampler(
            self.adapters,
            self.tokenizer,
            eos_token_ids=self.prompts.eos_token_ids,
            generator=self.generator,
            lock=self.lock,
            fast=FastSampling(
                self.fast_paths, model, own_adapter=self.adapters.own, precision=sampler_precision
            ),
        )

    @property
    def model(self):
        """The peft model (or the plain base model of a policy without adapters)."""
        return self.adapters.model

    def generate(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        adapter: str | None = None,
        cancelled: Sequence[Callable[[], bool]] | None = None,
    ) -> list[list[Completion]]:
        """Sample completions for several prompts in one batch (blocking).

        `adapter` names an extra adapter loaded with `adapters.load`; None samples with the
        policy's own weights (its training or `adapter_path` adapter, or the base model if it has
        none). `cancelled[i]()` turning True drops prompt i's rows at the next decode step.
        """
        return self.sampler.generate(prompts, params, adapter, cancelled)

    @contextlib.contextmanager
    def training_phase(self) -> Iterator[None]:
        """The trainer's optimizer step runs inside this: sampler and trainer are one model, so only
        the training speed paths apply (the vLLM policy also puts its engine to sleep here)."""
        with speed.training(self.fast_paths, self.model, self.sampler.fast):
            yield
