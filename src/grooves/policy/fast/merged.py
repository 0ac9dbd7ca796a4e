"""Sampling with the LoRA adapter folded into the weights: one matmul per layer instead of three.

A peft LoRA layer computes `x W^T + s (x A^T) B^T`: the base matmul plus two thin ones and their
elementwise glue, in every adapted layer. In a decode step at a few rows every op is tiny, and on
a CPU the thin matmuls and glue are a large share of the step. Sampling needs no gradients, so it
can run on `W' = W + s B A` instead (the same function, up to float rounding), and training
differentiates the unmerged layers (its forward reads the sampler's packed folds where they exist,
`packed_training.py`). CHANGELOG.md (change 6) measures it.

The folded weights live in their own buffers, swapped in for the duration of a sampling batch
and swapped out after, so the base weights are never changed: peft's in-place
`merge_adapter` / `unmerge_adapter` would add and subtract the update at every step and let
rounding walk the frozen base weights away from the checkpoint. The cost is one extra copy of the
adapted weights in memory.
The buffers of layers that read the same input in one block (q, k, v, o; gate, up) are
consecutive rows of one allocation, which the sampler's decoder runs as a single matmul.

With `dense=False` no buffers are made: the sampler's packed kernels fold the adapter straight
into their packed copies of the weights (`kernels.PackedKernels`), and this object only tells them
when the adapter changed (`generation`, `stamp`); the layers stay peft's, adapter on.

The buffers are refreshed only when an adapter weight changed since the last refresh. What
tells is a copy of the adapter weights each fold was made from (small: A and B only), compared exactly
before every sampling batch: torch's per-tensor version counter would be cheaper but misses
writers that bypass it (torch's fused AdamW updates its parameters without bumping it).
"""

from __future__ import annotations

import contextlib
import itertools
from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:
    from peft.tuners.lora import Linear as LoraLinear


def _base_weight(layer: LoraLinear) -> torch.Tensor:
    return cast(torch.Tensor, layer.base_layer.weight)


class MergedWeights:
    """One adapter of a `PeftModel` (peft's `default`: the policy's own), folded into copies of its base weights on demand."""

    def __init__(self, model, adapter: str = "default", dense: bool = True):
        from peft.tuners.lora import Linear as LoraLinear
        from peft.tuners.lora import LoraLayer

        self.model = model
        self.adapter = adapter
        lora_layers = [m for m in model.modules() if isinstance(m, LoraLayer) and adapter in m.lora_A]
        # only plain linear layers fold this way (not embeddings, convolutions, DoRA, biased LoRA)
        self.supported = bool(lora_layers) and all(
            isinstance(m, LoraLinear)
            and not m.use_dora.get(adapter, False)
            and not m.lora_bias.get(adapter, False)
            and _base_weight(m).dtype.is_floating_point
            for m in lora_layers
        )
        # supported: every one is a LoraLinear
        self.layers = cast("list[LoraLinear]", lora_layers) if self.supported else []
        names = {id(m): name for name, m in model.named_modules()}
        self._parents = [names[id(m)].rpartition(".")[0] for m in self.layers]
        self._buffers: list[torch.Tensor | None] | None = None
        self._folded_from: list[tuple[torch.Tensor, torch.Tensor]] = []
        """Per layer, copies of the (A, B) its buffer was computed from."""
        self.generation = 0
        """Counts the refreshes that changed a buffer: what copies made from the buffers are stamped with."""
        self._storages: set[int] = set()
        self.dense = dense
        """False: no buffers; the packed kernels fold the adapter themselves (see the module's doc)."""
        self.tracking = False
        """Inside `applied()`: `generation` is up to date with the adapter (it is checked on entry)."""

    @torch.no_grad()
    def refresh(self) -> None:
        """Recompute W + s B A for every layer whose adapter weights differ from the ones last folded."""
        if self._buffers is None:
            self._buffers = list(self._allocate()) if self.dense else [None] * len(self.layers)
            self._storages = {b.untyped_storage().data_ptr() for b in self._buffers if b is not None}
        changed = False
        for i, (m, buf) in enumerate(zip(self.layers, self._buffers, strict=True)):
            a = cast(torch.Tensor, m.lora_A[self.adapter].weight)
            b = cast(torch.Tensor, m.lora_B[self.adapter].weight)
            if i < len(self._folded_from):
                old_a, old_b = self._folded_from[i]
                if torch.equal(a, old_a) and torch.equal(b, old_b):
                    continue
                old_a.copy_(a)
                old_b.copy_(b)
            else:
                self._folded_from.append((a.detach().clone(), b.detach().clone()))
            changed = True
            if buf is None:
                continue  # the packed kernels fold it
            w = _base_weight(m)
            if not m.fan_in_fan_out and a.dtype == b.dtype == w.dtype:
                # W + s B A in one pass over the weight, instead of materializing B A, scaling it and adding
                torch.addmm(w, b, a, alpha=m.scaling[self.adapter], out=buf)
            else:
                torch.add(w, m.get_delta_weight(self.adapter).to(buf.dtype), out=buf)
        self.generation += changed

    def stamp(self, weight: torch.Tensor) -> object:
        """A weight's content stamp: the refresh generation for one of the folded buffers, else
        torch's version counter (a swapped-in buffer's writes do not bump its parameter's)."""
        if weight.untyped_storage().data_ptr() in self._storages:
            return ("folded", self.generation)
        return weight._version

    def _allocate(self) -> list[torch.Tensor]:
        """One buffer per layer, as consecutive rows of one block for layers of one parent that share
        their input (q, k, v and o of an attention; gate and up of an MLP), so that a decoder can run
        each such group as one matmul (`policy/fast/decode.py`)."""

        def group_key(i: int) -> tuple:
            m = self.layers[i]
            w = _base_weight(m)
            if m.fan_in_fan_out:  # its weight is [in, out]: rows are not outputs, so it stays alone
                return (i,)
            return (self._parents[i], w.shape[1], w.dtype, w.device)

        groups = [list(g) for _, g in itertools.groupby(range(len(self.layers)), key=group_key)]
        buffers: list[torch.Tensor] = [None] * len(self.layers)  # type: ignore[list-item]
        for group in groups:
            weights = [_base_weight(self.layers[i]) for i in group]
            block = weights[0].new_empty((sum(w.shape[0] for w in weights), *weights[0].shape[1:]))
            for i, part in zip(group, block.split([w.shape[0] for w in weights]), strict=True):
                buffers[i] = part
        return buffers

    @contextlib.contextmanager
    def applied(self):
        """Inside: the model computes with the folded weights and its LoRA layers switched off
        (with `dense=False`: as it is, the adapter on; `generation` counts its changes)."""
        self.refresh()
        if not self.dense:
            self.tracking = True
            try:
                yield
            finally:
                self.tracking = False
            return
        originals = [m.base_layer.weight.data for m in self.layers]
        with self.model.disable_adapter():
            for m, buf in zip(self.layers, self._buffers, strict=True):
                m.base_layer.weight.data = buf
            try:
                yield
            finally:
                for m, w in zip(self.layers, originals, strict=True):
                    m.base_layer.weight.data = w
