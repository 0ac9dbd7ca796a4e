"""The policy: a model that samples for the server and trains for the trainer (`base.Policy`).

Backends: `transformers.TransformersPolicy` (CPU or GPU, with the CPU speed paths of `fast/`)
and `vllm.VLLMPolicy` (sampling with vLLM on a GPU). `policy_for` picks one from the run file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grooves.config import LoraConfig, ModelConfig, VllmConfig
    from grooves.policy.base import Policy


def policy_for(
    model: ModelConfig, lora: LoraConfig, *, seed: int, served_name: str, vllm: VllmConfig | None = None
) -> Policy:
    """The trainable policy the `[model]` and `[lora]` sections describe.

    `model.backend = "vllm"` with `vllm` settings gives a `VLLMPolicy`; otherwise (and always
    without `vllm` settings: SFT samples only to validate) a `TransformersPolicy`. Each backend
    is imported here, when chosen: a CPU install never needs vLLM.
    """
    from grooves.config.check import resolve_init_adapter

    # `model.init_adapter`: trained further (loaded trainable, as `lora` is set)
    init = resolve_init_adapter(model.init_adapter) if model.init_adapter else None
    if model.backend == "vllm" and vllm is not None:
        from grooves.policy.vllm import VLLMPolicy

        return VLLMPolicy(
            model.base_model,
            lora=lora,
            dtype=model.dtype,
            device=model.device,
            tool_format=model.tool_format,
            seed=seed,
            served_name=served_name,
            gpu_memory_utilization=vllm.gpu_memory_utilization,
            sleep_level=vllm.sleep_level,
            max_model_len=vllm.max_model_len,
            enforce_eager=vllm.enforce_eager,
            fast=model.fast,
            adapter_path=init,
        )
    from grooves.policy.transformers import TransformersPolicy

    return TransformersPolicy(
        model.base_model,
        lora=lora,
        dtype=model.dtype,
        device=model.device,
        tool_format=model.tool_format,
        seed=seed,
        served_name=served_name,
        fast=model.fast,
        adapter_path=init,
        sampler_precision=model.sampler_precision,
    )
