"""The trainer's forward on the sampler's packed weights: the LoRA adapter folded in, and the output head.

After a sampling batch the sampler holds each group of layers that read one input (q, k, v; o;
gate, up; down) as one oneDNN-packed matrix with the adapter folded in, `W' = W + s B A`
(`kernels._FoldedPacked`). The trainer's forward computes the same function, `x W^T + s (x A^T)
B^T` per layer, as three matmuls in each of the 7 layers of a block and the glue between them.
Here each group runs as one matmul on `W'` instead, in the forward:

    y = x W'^T                                       (one packed matmul for the group)

and the backward differentiates `x W^T + s (x A^T) B^T`, so every gradient is LoRA's own:

    dL/dB_i = s_i g_i^T (x A_i^T)        dL/dA_i = s_i (g_i B_i)^T x
    dL/dx   = sum_i g_i W_i + s_i (g_i B_i) A_i

with g_i the output gradient of layer i of the group and W_i its frozen base weight (dense,
the model's own). The group's A_i are stacked, so `x A^T` and the `A` terms are one matmul each.
The forward is the sampler's function up to rounding: the trainer's logprobs are computed on the
very weights the sampler drew with.

transformers calls the layers one by one (`q_proj(h)`, then `k_proj(h)`, `v_proj(h)`), so the
group's first layer computes the whole group and leaves the others their outputs, which they
take when called on the same input tensor; anything else (another input, extra arguments, an
adapter that is not the sampler's own, a group the sampler has not packed yet) runs the layer's
forward as before (`lora_addmm`'s). The output head, a frozen plain linear layer, runs on the
sampler's packed copy of it too, its backward `dL/dx = g W` on the dense weight. The sampler's
packed weights are borrowed, never made: a run that only trains (SFT without sampling) allocates
nothing here. The fold is checked against the adapter before every forward of the model
(`MergedWeights.refresh`), so an optimizer step between two forwards is seen. CHANGELOG.md
(change 19) measures it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from grooves.policy.fast.lora_addmm import plain_adapter

if TYPE_CHECKING:
    from peft.tuners.lora import LoraLayer

Fold = Callable[[list[nn.Module]], "tuple[torch.Tensor, torch.Tensor | None] | None"]
"""A group's (packed `W + s B A`, joined bias), or None: `PackedKernels.training_fold`."""
Packed = Callable[[nn.Module], "tuple[torch.Tensor, torch.Tensor | None] | None"]
"""A plain linear layer's (packed `W`, bias) as the sampler keeps it, or None: `PackedKernels.training_packed`."""


class _PackedLinear(torch.autograd.Function):
    """y = x W^T + b on W's packed copy; dL/dx = g W on the dense W (W and b are frozen)."""

    @staticmethod
    def forward(ctx, x, packed, bias, weight):  # x [N, in]
        ctx.weight = weight
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")  # [N, out]

    @staticmethod
    def backward(ctx, grad):
        return torch.mm(grad, ctx.weight), None, None, None


def _head_forward(head: nn.Linear, fallback, packed: Packed):
    def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        frozen = not head.weight.requires_grad and (head.bias is None or not head.bias.requires_grad)
        found = packed(head) if frozen and not args and not kwargs else None
        if found is None:
            return fallback(x, *args, **kwargs)
        y = _PackedLinear.apply(x.reshape(-1, x.shape[-1]), found[0], found[1], head.weight)
        return y.view(*x.shape[:-1], y.shape[-1])

    return forward


class _FoldedGroup(torch.autograd.Function):
    """y = x W'^T on the packed folded weights; the gradients of `x W_i^T + s_i (x A_i^T) B_i^T`.

    `lora_at[i]` is layer i's place among the adapters (`lora`: A_1..A_k, then B_1..B_k, in layer
    order), or None for a layer without one (rank 0: `x W_i^T` alone, as `kernels._lora_of` has it)."""

    @staticmethod
    def forward(ctx, x, packed, bias, bases, scales, lora_at, *lora):  # x [N, in]
        ctx.bases, ctx.scales, ctx.lora_at = bases, scales, lora_at
        ctx.save_for_backward(x, *lora)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")  # [N, sum out]

    @staticmethod
    def backward(ctx, grad):  # grad [N, sum out]
        x, *lora = ctx.saved_tensors
        k = len(lora) // 2
        a_parts, b_parts = lora[:k], lora[k:]
        ranks = [a.shape[0] for a in a_parts]
        a = torch.cat(a_parts) if k > 1 else a_parts[0]  # [sum r, in]
        # (A x^T)^T, not x A^T: the same product; its kernel was the faster at rank-sized outputs in isolation
        xa = torch.mm(a, x.t()).t().split(ranks, dim=1)  # [N, r_j] each
        grad_x = None
        grad_b, gxa = [], []
        outs = [w.shape[0] for w in ctx.bases]
        for g, w, j in zip(grad.split(outs, dim=1), ctx.bases, ctx.lora_at, strict=True):
            if ctx.needs_input_grad[0]:
                grad_x = torch.mm(g, w) if grad_x is None else grad_x.addmm_(g, w)
            if j is None:  # no adapter on this layer: only its base passes the gradient on
                continue
            s = ctx.scales[j]
            gxa.append(torch.mm(b_parts[j].t(), g.t()).t() * s)  # s g B [N, r]
            grad_b.append(torch.mm(xa[j].t(), g).t() * s)  # s g^T (x A^T) [out, r]
        gxa_all = torch.cat(gxa, dim=1) if k > 1 else gxa[0]  # [N, sum r]
        grad_a = torch.mm(gxa_all.t(), x).split(ranks)  # [sum r, in]
        if grad_x is not None:
            grad_x.addmm_(gxa_all, a)
        return (grad_x, None, None, None, None, None, *grad_a, *grad_b)


def _weight(layer: nn.Module) -> torch.Tensor:
    return cast(torch.Tensor, layer.weight)


def _adapter_of(layer: nn.Module) -> str | None:
    """The plain LoRA adapter a layer of a group runs (`plain_adapter`), "" for a plain linear layer
    (a layer `lora.target_modules` left out: rank 0), None for anything else."""
    if type(layer) is nn.Linear:
        return ""
    return plain_adapter(layer) if hasattr(layer, "lora_A") else None


def _group_forward(group: list[nn.Module], index: int, fallback, fold: Fold, adapter: str, left: dict):
    layer = group[index]

    def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if index > 0:  # the group's first layer may have computed this one already, on this input
            hit = left.pop(layer, None)
            if hit is not None and hit[0] is x and not args and not kwargs:
                return hit[1]
            return fallback(x, *args, **kwargs)
        adapters = [_adapter_of(m) for m in group]
        if args or kwargs or adapter not in adapters or any(a not in (adapter, "") for a in adapters):
            return fallback(x, *args, **kwargs)
        folded = fold(group)
        if folded is None:
            return fallback(x, *args, **kwargs)
        packed, bias = folded
        # a layer with an adapter is a peft LoRA layer (`_adapter_of`)
        bases = [
            _weight(cast("LoraLayer", m).get_base_layer() if a else m)
            for m, a in zip(group, adapters, strict=True)
        ]
        tuned = [cast("LoraLayer", m) for m, a in zip(group, adapters, strict=True) if a]
        lora_at, j = [], 0
        for a in adapters:
            lora_at.append(j if a else None)
            j += bool(a)
        lora = [_weight(m.lora_A[adapter]) for m in tuned] + [_weight(m.lora_B[adapter]) for m in tuned]
        scales = [float(m.scaling[adapter]) for m in tuned]
        y = _FoldedGroup.apply(x.reshape(-1, x.shape[-1]), packed, bias, bases, scales, lora_at, *lora)
        outs = y.split([w.shape[0] for w in bases], dim=-1)
        outs = [o.view(*x.shape[:-1], o.shape[-1]) for o in outs]
        for other, out in zip(group[1:], outs[1:], strict=True):
            left[other] = (x, out)
        return outs[0]

    return forward


@contextlib.contextmanager
def on_packed_weights(
    model: nn.Module,
    groups: list[list[nn.Module]],
    fold: Fold,
    refresh: Callable[[], None],
    adapter: str,
    packed: Packed,
) -> Iterator[None]:
    """Inside: each group of `groups` (layers on one input, in the order the model calls them) whose
    layers are plain LoRA layers with `adapter` on (or plain linear layers without an adapter, rank 0;
    at least one with it) runs as one matmul on `fold(group)`, and the
    output head on `packed(head)`; `refresh()` runs before every forward of `model`, to bring the
    folds up to date with the adapter."""
    left: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}
    saved = []
    for group in groups:
        for i, layer in enumerate(group):
            previous = vars(layer).get("forward")
            saved.append((layer, previous))
            layer.forward = _group_forward(group, i, layer.forward, fold, adapter, left)
    # a transformers model's method (nn.Module's attribute lookup is typed Tensor | Module)
    head = cast(Callable[[], nn.Module | None], model.get_output_embeddings)()
    if type(head) is nn.Linear:
        saved.append((head, vars(head).get("forward")))
        # an instance attribute, which nn.Module calls in place of the class's forward
        head.forward = _head_forward(head, head.forward, packed)  # type: ignore[method-assign]
    hook = model.register_forward_pre_hook(lambda *_: refresh())
    try:
        yield
    finally:
        hook.remove()
        left.clear()
        for layer, previous in reversed(saved):
            if previous is None:
                del layer.forward
            else:
                layer.forward = previous
