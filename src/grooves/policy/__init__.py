"""The policy: a model that samples for the server and trains for the trainer (`base.Policy`).

Backends: `transformers.TransformersPolicy` (CPU or GPU, with the CPU speed paths of `fast/`)
and `vllm.VLLMPolicy` (sampling with vLLM on a GPU). `policy_for` picks one from the run file;
`shared_base` loads a base model once for several transformers policies (the training service).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grooves.config import LoraConfig, ModelConfig, VllmConfig
    from grooves.policy.base import Policy
    from grooves.policy.transformers import SharedBase


def shared_base(base_model: str, *, dtype: str = "float32", device: str = "cpu") -> SharedBase:
    """A base model loaded once, for `policy_for(..., base=...)` policies that share its weights."""
    from grooves.policy.transformers import SharedBase

    return SharedBase(base_model, dtype=dtype, device=device)


def policy_for(
    model: ModelConfig,
    lora: LoraConfig | None,
    *,
    seed: int,
    served_name: str,
    vllm: VllmConfig | None = None,
    base: SharedBase | None = None,
) -> Policy:
    """The policy the `[model]` and `[lora]` sections describe (trainable; sampling only without `lora`).

    `model.backend = "vllm"` with `vllm` settings gives a `VLLMPolicy`; otherwise (and always
    without `vllm` settings: SFT samples only to validate) a `TransformersPolicy`. Each backend
    is imported here, when chosen: a CPU install never needs vLLM. With `base` (a `shared_base`),
    a `TransformersPolicy` over its weights instead of a load of `model.base_model`.
    """
    if base is not None and model.backend == "vllm":
        raise ValueError(
            "model.backend: a policy on a shared base runs on transformers; set it to transformers"
        )
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
            kv_cache_gib=vllm.kv_cache_gib,
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
        base=base,
        adapter_path=init,
        sampler_precision=model.sampler_precision,
    )
