"""The `[model]`, `[lora]` and `[vllm]` sections: which model, its adapter, how it samples."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from grooves.config.base import Section

FastMode = Literal["on", "timed", "off"]
"""What `ModelConfig.fast` may be (see `grooves.policy.fast`)."""
SamplerPrecision = Literal["float32", "bfloat16", "int8"]
"""What `ModelConfig.sampler_precision` may be (see `grooves.policy.fast.kernels`)."""
ToolFormats = Literal["smollm2", "template"]
"""What `ModelConfig.tool_format` may be (the names of `policy.tool_format.TOOL_FORMATS`)."""
_DEVICE = re.compile(r"^(cpu|mps|(cuda|xpu)(:\d+)?)$")


class ModelConfig(Section):
    base_model: str = "smollm2-135m"
    """`smollm2-135m` (the embedded default, provisioned offline), a local directory, or a hub id."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """float32 on CPU (bf16 matmuls are slow there and logprob mismatch grows); bf16 on GPUs."""
    device: str = "cpu"
    """`cpu`, `cuda`, `cuda:N`, `mps`, `xpu` or `xpu:N`; a device torch does not see is refused at start."""
    tool_format: ToolFormats | None = None
    """How tools appear in the prompt: `smollm2`, `template`, or unset to pick from the chat template."""
    backend: Literal["transformers", "vllm"] = "transformers"
    """`vllm` samples with vLLM (on a GPU, or on the CPU with vLLM's CPU build; docs/vllm.md) while
    training stays on transformers+peft."""
    fast: FastMode = "on"
    """The CPU speed paths (`grooves.policy.fast`), each the same function in fewer operations: the
    sampler's own decode forward (Llama/Qwen2), the LoRA adapter folded into a copy of the adapted
    weights for sampling (one more copy of those weights in memory), glibc keeping freed blocks
    (the process keeps its peak memory between steps), LoRA layers as one addmm in training.
    `on`: all of them, every matmul `x W^T`: two runs of one seed are bit-identical where batching
    allows. `timed`: also the output head's matmul form picked by timing it per row count (faster
    on some CPUs; a choice timed on a busy machine can differ between two runs of one seed, which
    then drift apart). `off`: plain transformers + peft. See docs/speed.md."""
    init_adapter: str | None = None
    """Start training from these adapter weights instead of a fresh LoRA (e.g. an SFT warm start):
    an adapter folder (peft), a checkpoint (`runs/x/checkpoints/step_N`) or a run folder (its
    latest checkpoint). Checked at start: it must have been trained on this `base_model`, and its
    rank, alpha and target modules must equal `[lora]`'s. The optimizer starts fresh."""
    sampler_precision: SamplerPrecision = "float32"
    """The base weights the sampler's decode steps read. `float32`: the trainer's function
    (logprobs within float rounding of the trainer's). `bfloat16` (half the bytes) or `int8`
    (weight-only, a quarter): copies of the base weights for decoding, the LoRA adapter in float32
    on top (CPU only; Llama/Qwen2 in float32 with `fast` on; `bfloat16` needs AVX512 or
    AVX-NE-CONVERT, which AVX2 CPUs lack: checked at start). Faster decoding, but the sampler's
    distribution is no longer the trainer's: the trainer logs the gap (`mismatch_k3_mean`); set
    `algorithm.tis_cap` to correct for it. The prefill and the trainer always run the `dtype`
    weights. See docs/speed.md for what each pays off on a CPU."""

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError("not a device; use cpu, cuda, cuda:N, mps, xpu or xpu:N")
        return value


class LoraConfig(Section):
    """The LoRA adapter the policy trains (`policy.transformers.load_model` reads this section)."""

    rank: int = Field(8, ge=1)
    """Adapter rank. RL moves few directions: ranks 1-16 train as well as full rank for small tasks."""
    alpha: float = Field(16.0, gt=0)
    """Update scale is alpha/rank; keep alpha/rank near 2 when changing rank."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """LoRA dropout; 0 keeps the sampler's and trainer's logprobs equal (dropout is off when sampling)."""
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], min_length=1
    )
    """Linear layers that get adapters: attention and MLP (all) learn faster than attention only.
    Each name must match a layer of the model (checked at start, before the weights load)."""


class VllmConfig(Section):
    """Settings of the vLLM backend (`model.backend = "vllm"`), unused otherwise."""

    gpu_memory_utilization: float = Field(0.3, gt=0, lt=1)
    """Share of the GPU vLLM takes (weights + KV cache); training on the same GPU uses the rest.
    More = larger decode batches, less room for training activations."""
    sleep_level: Literal[0, 1, 2] = 0
    """0: vLLM stays resident. 1: it sleeps through each optimizer step (weights to CPU RAM, KV cache
    freed), for models whose training needs the whole GPU; costs a weight copy each way per step.
    2: weights dropped instead (less CPU RAM, reloaded from disk each step). GPU only: vLLM's CPU
    build has no sleep mode, and a run that asks for it there is refused at start."""
    enforce_eager: bool = False
    """Skip CUDA-graph capture: starts ~1 min sooner, decodes slower. For short runs and tests."""
    max_model_len: int | None = None
    """Context length vLLM reserves KV cache for; unset: the model's. Lower it to fit more sequences."""
    kv_cache_gib: float | None = Field(None, gt=0)
    """Memory vLLM's KV cache takes, in GiB. Unset: what `gpu_memory_utilization` leaves after the
    weights on a GPU, and 1 GiB on vLLM's CPU build (whose `gpu_memory_utilization` would be a share
    of the machine's RAM: 0.3 of 24 GiB). 1 GiB holds ~23,000 tokens of SmolLM2-135M in float32."""
