"""The run-file fields that depend on the model, checked before its weights load."""

from __future__ import annotations

from grooves.config.base import ConfigError
from grooves.config.run import RunConfig
from grooves.models import ModelError, resolve_model


def check_against_model(config: RunConfig) -> None:
    """The run-file fields that depend on the model, checked before its weights load.

    From the model's config.json alone (and a weightless copy of the model on the `meta` device):
    `rollout.max_tokens` must leave room for a prompt in the model's context, each name in
    `lora.target_modules` must be a layer of the model (peft ignores a misspelt one when another
    matches), and `model.device` must be one torch sees. Raises `ConfigError`, one line per
    problem. A model whose config cannot be read here (a hub id while offline, remote code) is left
    to the loader, which reports its own error.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    problems = [p for p in [_device_problem(config.model.device)] if p]
    try:
        model_config = AutoConfig.from_pretrained(resolve_model(config.model.base_model))
    except ModelError as exc:
        problems.append(f"model.base_model: {str(exc).splitlines()[0]}")
        model_config = None
    except (OSError, ValueError, KeyError):  # not readable here; the loader says why
        model_config = None
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
