"""Moved to `grooves.policy.vllm`; kept for compatibility."""

from grooves.policy.vllm import (
    VLLM_LORA_RANKS,
    AdapterPublisher,
    AdapterRef,
    VLLMPolicy,
    completion_from_vllm,
    lora_rank_cap,
    vllm_sampling_kwargs,
)

__all__ = [
    "AdapterPublisher",
    "AdapterRef",
    "VLLMPolicy",
    "VLLM_LORA_RANKS",
    "completion_from_vllm",
    "lora_rank_cap",
    "vllm_sampling_kwargs",
]
