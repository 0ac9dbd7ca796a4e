"""LoRA layers in training as `addmm(x W^T + b, x A^T, B^T, alpha=s)`: the adapter's product, its
scale and the sum in one matmul.

peft computes `result + lora_B(lora_A(dropout(x))) * scaling`: after the two thin matmuls it
multiplies the [tokens, out] update by the scale and adds it to the base output, two elementwise
passes in the forward and one more (the scale's gradient) in the backward, in every LoRA layer.
`torch.addmm` folds the scale and the sum into the B matmul's epilogue, and autograd
differentiates it as it is (the same gradients, up to float rounding). CHANGELOG.md (change 15)
measures what it saves.

Only plain LoRA layers change: one active adapter, no dropout (p = 0), no DoRA or other variant,
not merged, adapters enabled. Any other layer, or one whose state changes inside the block
(`disable_adapter()` for the reference logprobs), runs peft's own forward, checked at each call.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn


def _addmm_forward(layer, peft_forward):
    def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        adapter = plain_adapter(layer)
        if adapter is None or args or kwargs:
            return peft_forward(x, *args, **kwargs)
        base = layer.get_base_layer()
        a, b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
        flat = x.reshape(-1, x.shape[-1])
        y = torch.addmm(
            F.linear(flat, base.weight, base.bias), F.linear(flat, a), b.t(), alpha=layer.scaling[adapter]
        )
        return y.view(*x.shape[:-1], y.shape[-1])

    return forward


def plain_adapter(layer) -> str | None:
    """The one active adapter of a LoRA linear layer if its forward is the plain `x W^T + s x A^T B^T`."""
    if layer.disable_adapters or layer.merged or getattr(layer, "fan_in_fan_out", False):
        return None
    active = [a for a in layer.active_adapters if a in layer.lora_A]
    if len(active) != 1:
        return None
    adapter = active[0]
    if adapter in getattr(layer, "lora_variant", {}) or not isinstance(
        layer.lora_dropout[adapter], nn.Identity
    ):
        return None
    base = layer.get_base_layer()
    if type(base) is not nn.Linear or layer.lora_A[adapter].weight.dtype != base.weight.dtype:
        return None
    return adapter


@contextlib.contextmanager
def addmm_lora(model: nn.Module):
    """Inside: the model's plain LoRA linear layers compute their adapter with one `addmm`."""
    from peft.tuners.lora import Linear as LoraLinear

    layers = [m for m in model.modules() if type(m) is LoraLinear]
    for m in layers:
        # an instance attribute: nn.Module calls it first
        m.forward = _addmm_forward(m, m.forward)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m in layers:
            del m.forward
