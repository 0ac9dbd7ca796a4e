"""The matmul kernels of the sampler's decode steps: MKL's `x W^T`, oneDNN on prepacked weights, or int8.

A decode step multiplies a few rows (1-64) by every weight of the model, so its time is the time
to stream the weights through the matmul kernel. On a CPU the kernel behind `F.linear` (MKL's
sgemm) reads the weights far below the memory's bandwidth at so few rows; how far depends on the
CPU (docs/speed.md, "The floor"). The decoder (`decode.FusedDecode`) asks one of these for each
group of layers that read the same input (q, k, v; gate, up; o; down; the output head) and gets a
function `x [R, 1, in] -> y [R, 1, sum of outs]`, or None where it must call the modules:

- `PlainKernels`: `F.linear`, i.e. MKL, in the form `x W^T` or `(W x^T)^T` (`decode.MatmulPlan`);
- `PackedKernels` (`model.fast = "on"`): oneDNN's inner product on weights reordered once into its
  blocked layout (the op torch.compile's CPU backend emits for a frozen linear layer). The same
  float32 product, rounded differently; the packed copies are kept until their weights change;
- `LowPrecisionKernels` (`model.sampler_precision = "int8"` or `"bfloat16"`): int8 or bfloat16
  copies of the base weights, with the layer's LoRA adapter applied on top in float32
  (`x W_q^T + s (x A^T) B^T`). Not the trainer's function: the sampler's logprobs differ from the
  trainer's, which the trainer measures (`mismatch_k3_mean`) and can correct for
  (`algorithm.tis_cap`).

Each keeps what it prepared (packed or quantized weights) across batches, keyed by the weight it
came from and a stamp of that weight's content (`stamp`), so a changed weight is prepared again.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Generic, TypeVar, cast, overload

import torch
import torch.nn.functional as F
from torch import nn

from grooves.config.check import cpu_packs_bfloat16

Runner = Callable[[torch.Tensor, bool], torch.Tensor]
"""`(x [R, 1, in], transposed) -> [R, 1, out]`: one group's outputs, concatenated in the group's order."""


def plain_linear(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(weight, bias) that `module` computes `x W^T + b` with, or None if it computes more (an active LoRA)."""
    from peft.tuners.lora import LoraLayer

    if isinstance(module, LoraLayer):
        active = [a for a in module.active_adapters if a in module.lora_A]
        if module.merged and module.disable_adapters:
            return None  # peft unmerges on the next forward
        if module.merged or module.disable_adapters or not active:
            return plain_linear(module.get_base_layer())
        return None
    if type(module) is nn.Linear:
        return module.weight, module.bias
    return None


def fused_weight(weights: list[torch.Tensor]) -> torch.Tensor | None:
    """The [sum of rows, in] matrix the weights form without a copy: a single weight itself, several
    if they are consecutive rows of one buffer; else None."""
    first = weights[0]
    if len(weights) == 1:
        return first
    for prev, w in zip(weights, weights[1:], strict=False):
        if not (
            w.is_contiguous()
            and prev.is_contiguous()
            and w.dtype == first.dtype
            and w.device == first.device
            and w.shape[1] == first.shape[1]
            and w.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
            and w.storage_offset() == prev.storage_offset() + prev.numel()
        ):
            return None
    rows = sum(w.shape[0] for w in weights)
    return first.as_strided((rows, first.shape[1]), (first.shape[1], 1))


def _joined_bias(weights: list[torch.Tensor], biases: list[torch.Tensor | None]) -> torch.Tensor | None:
    if all(b is None for b in biases):
        return None
    return torch.cat(
        [b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(weights, biases, strict=True)]
    )


def matmul(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool
) -> torch.Tensor:
    """`x W^T + b` for x [R, 1, in], either as that or as `(W x^T)^T` (the same product, another BLAS kernel)."""
    if not transposed:
        return F.linear(x, weight, bias)
    rows = x.shape[0]
    xt = x.reshape(rows, x.shape[-1]).t()
    y = torch.mm(weight, xt) if bias is None else torch.addmm(bias[:, None], weight, xt)  # [out, R]
    return y.t().reshape(rows, 1, weight.shape[0])


class PlainKernels:
    """`F.linear` on the layers' own weights; a group runs as one matmul when its weights are rows of one buffer."""

    def group(self, modules: list[nn.Module]) -> Runner | None:
        found = [plain_linear(m) for m in modules]
        plain = [p for p in found if p is not None]
        if len(plain) < len(found):
            return None
        weights = [w for w, _ in plain]
        weight = fused_weight(weights)
        if weight is None:
            return None
        bias = _joined_bias(weights, [b for _, b in plain])
        return lambda x, transposed: matmul(x, weight, bias, transposed)


Stamp = Callable[[torch.Tensor], object]
"""What a weight's content is known by: prepared copies are reused while it is unchanged."""


def version_stamp(weight: torch.Tensor) -> object:
    """torch's version counter: bumped by every in-place write through torch (not by `.data =`)."""
    return weight._version


Copy = TypeVar("Copy")


class _Prepared(Generic[Copy]):
    """Copies prepared from weights, by (storage, offset, shape) of the weights and their stamps."""

    def __init__(self, stamp: Stamp):
        self.stamp = stamp
        self._entries: dict[tuple, tuple[tuple, Copy]] = {}

    @overload
    def get(
        self,
        weights: list[torch.Tensor],
        make: Callable[[], Copy],
        update: Callable[[Copy], None] | None = None,
    ) -> Copy: ...

    @overload
    def get(
        self, weights: list[torch.Tensor], make: None, update: Callable[[Copy], None] | None = None
    ) -> Copy | None: ...

    @overload
    def get(
        self,
        weights: list[torch.Tensor],
        make: Callable[[], Copy] | None,
        update: Callable[[Copy], None] | None = None,
    ) -> Copy | None: ...

    def get(
        self,
        weights: list[torch.Tensor],
        make: Callable[[], Copy] | None,
        update: Callable[[Copy], None] | None = None,
    ) -> Copy | None:
        """The copy prepared from `weights` as they are now: kept, `make()`, or, for changed weights,
        the kept copy rewritten in place by `update(copy)` where given. Without `make`, None where
        no copy was made yet (nothing is made)."""
        key = tuple((w.untyped_storage().data_ptr(), w.storage_offset(), tuple(w.shape)) for w in weights)
        stamps = tuple(self.stamp(w) for w in weights)
        hit = self._entries.get(key)
        if hit is not None and hit[0] == stamps:
            return hit[1]
        if hit is not None and update is not None:
            update(hit[1])
            value = hit[1]
        elif make is None:
            return None
        else:
            value = make()
        self._entries[key] = (stamps, value)
        return value


def onednn_available() -> bool:
    """This torch has oneDNN with its prepacked float32 linear ops."""
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


@functools.cache
def blocked_layout(out: int, inp: int, rows_hint: int) -> int | None:
    """b if `_reorder_linear_weight` lays a float32 [out, in] weight out as a dense [out / b, in, b]
    block array on this CPU (packed[g, i, j] = W[g b + j, i]), else None (another layout, padding,
    or no way to read the packed memory). Found by packing a probe of the same shape, once per shape."""
    if not hasattr(torch.ops.mkldnn, "data_ptr") or out * inp >= 2**24:  # the probe's values must be exact
        return None
    probe = torch.arange(out * inp, dtype=torch.float32).reshape(out, inp)
    packed = torch.ops.mkldnn._reorder_linear_weight(probe, rows_hint)
    if torch.ops.mkldnn._nbytes(packed) != out * inp * 4:
        return None
    seen = packed_memory(packed)
    for b in (8, 16, 32, 64, 128, 256):
        if out % b == 0 and torch.equal(seen, probe.view(out // b, b, inp).transpose(1, 2).reshape(-1)):
            return b
    return None


def packed_memory(packed: torch.Tensor) -> torch.Tensor:
    """The float32 memory of a oneDNN tensor as a flat dense tensor over it (no copy). It does not
    keep `packed` alive: whoever holds the view must hold `packed` too."""
    count = torch.ops.mkldnn._nbytes(packed) // 4
    memory = (ctypes.c_float * count).from_address(torch.ops.mkldnn.data_ptr(packed))
    return torch.frombuffer(memory, dtype=torch.float32, count=count)


class _FoldedPacked:
    """A group of LoRA layers' `W + s B A`, packed: the base's blocks are kept, and each change of
    the adapter writes `base + A^T (s B)^T` block by block into the packed memory, one `baddbmm`
    for the group (one contiguous pass, instead of folding a dense copy and repacking it;
    CHANGELOG.md, change 18)."""

    def __init__(self, bases: list[torch.Tensor], block: int, rows_hint: int):
        joined = bases[0] if len(bases) == 1 else torch.cat(bases)
        out, inp = joined.shape
        self.tensor = torch.ops.mkldnn._reorder_linear_weight(joined.detach(), rows_hint)
        self.blocks = packed_memory(self.tensor).view(out // block, inp, block)  # [out / b, in, b]
        self.base = self.blocks.clone()  # W's blocks: the tensor holds W + s B A from the first fold on

    def fold(self, lora: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """Write the base plus the group's stacked adapter (`_stacked_lora`: A [sum r, in], s B
        [out, sum r] block-diagonal) into the packed memory."""
        if lora is None:
            self.blocks.copy_(self.base)
            return
        a, b = lora
        groups, inp, block = self.blocks.shape
        torch.baddbmm(
            self.base,
            a.t().expand(groups, inp, a.shape[0]),  # [out / b, in, sum r]
            b.view(groups, block, b.shape[1]).transpose(1, 2),  # [out / b, sum r, b]
            out=self.blocks,
        )


class PackedKernels:
    """oneDNN's float32 inner product on weights reordered once into its blocked layout (CPU only).

    `torch.ops.mkldnn._reorder_linear_weight` lays a [out, in] weight out in the blocks oneDNN's
    kernel for this CPU reads (for a batch of `rows_hint` rows), and `_linear_pointwise` runs
    `x W^T + b` on it. These are the ops torch.compile's CPU backend (inductor, with frozen
    weights) emits for a linear layer; here they run without compiling anything. A group's
    weights are packed as one matrix even when they are not rows of one buffer.

    With `folds` (the policy's own adapter, tracked by a `MergedWeights(dense=False)`), LoRA
    layers with that adapter on run on `W + s B A` folded straight into the packed memory, where
    oneDNN's layout is a plain block array (`blocked_layout`; `_FoldedPacked`): no dense folded
    copy of the weights, and no repacking after an optimizer step (CHANGELOG.md, change 18).

    Every row count runs the packed kernel, one row included. An earlier measurement at load
    average 8-12 had MKL's matrix-vector kernel the faster at one row (3.6-5.6x); on a quiet
    machine the packed kernel was the faster in every round at one row too (1.65-2.02x, packed
    for 8 rows as here; docs/results/decode_kernels_quiet.json). `packed_from_rows = 2` brings
    back MKL's `x W^T` for a single row where the group is one matrix.
    """

    def __init__(
        self, stamp: Stamp = version_stamp, rows_hint: int = 8, packed_from_rows: int = 1, folds=None
    ):
        self.packed: _Prepared[torch.Tensor] = _Prepared(stamp)
        self.rows_hint = rows_hint
        self.packed_from_rows = packed_from_rows
        """Fewer rows than this run `PlainKernels`' `x W^T` where the group is one matrix."""
        self.folds = folds
        """A `MergedWeights(dense=False)` tracking the own adapter: layers with it active run on
        `W + s B A` folded into the packed copies here (`_FoldedPacked`); None: they run as peft's layers."""
        self.folded: _Prepared[_FoldedPacked] = _Prepared(lambda _: folds.generation)

    def group(self, modules: list[nn.Module]) -> Runner | None:
        found = [plain_linear(m) for m in modules]
        plain = [p for p in found if p is not None]
        if len(plain) < len(found):
            return self._folded_group(modules) if self.folds is not None else None
        weights = [w for w, _ in plain]
        if weights[0].device.type != "cpu" or weights[0].dtype != torch.float32:
            return PlainKernels().group(modules)
        bias = _joined_bias(weights, [b for _, b in plain])
        out = sum(w.shape[0] for w in weights)

        def pack() -> torch.Tensor:
            # the folded weights of a group are rows of one buffer: packed from it without a copy
            joined = fused_weight(weights)
            joined = torch.cat(weights) if joined is None else joined
            return torch.ops.mkldnn._reorder_linear_weight(joined.detach(), self.rows_hint)

        packed = self.packed.get(weights, pack)
        # MKL for fewer rows (None: the group's weights are not one matrix); not built when unused
        mkl = PlainKernels().group(modules) if self.packed_from_rows > 1 else None

        def run(x: torch.Tensor, transposed: bool) -> torch.Tensor:
            rows = x.shape[0]
            if rows < self.packed_from_rows and mkl is not None:
                return mkl(x, False)
            y = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, -1), packed, bias, "none", [], "")
            return y.reshape(rows, 1, out)

        return run

    def _folded_group(self, modules: list[nn.Module]) -> Runner | None:
        """LoRA layers with the own adapter on, on their base weights packed with the adapter folded
        in; None where they are not all such layers, the packed layout is opaque, or the batch does
        not run inside the folds' `applied()` (where their generation follows the adapter)."""
        if not self.folds.tracking:
            return None
        folded = self._folded(modules, create=True)
        if folded is None:
            return None
        packed, bias, out = folded

        def run(x: torch.Tensor, transposed: bool) -> torch.Tensor:
            rows = x.shape[0]
            y = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, -1), packed, bias, "none", [], "")
            return y.reshape(rows, 1, out)

        return run

    def training_fold(self, modules: list[nn.Module]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(packed `W + s B A`, joined bias) of a group of LoRA layers with the own adapter on, for
        the trainer's forward (`packed_training.on_packed_weights`), refolded if the adapter changed since.
        Only a group a sampling batch has packed already: training borrows the sampler's packed
        weights and never makes them (a run that only trains keeps its memory). The caller
        refreshes the folds' generation first (`MergedWeights.refresh`)."""
        folded = None if self.folds is None else self._folded(modules, create=False)
        return None if folded is None else folded[:2]

    def training_packed(self, module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(packed W, bias) of a plain linear layer (the output head) as a sampling batch packed it,
        for the trainer's forward; None where none was packed or its weight changed since."""
        plain = plain_linear(module)
        if plain is None:
            return None
        packed = self.packed.get([plain[0]], None)
        return None if packed is None else (packed, plain[1])

    def _folded(
        self, modules: list[nn.Module], create: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, int] | None:
        """(packed folded weights, joined bias, summed outputs) of the group, made if `create`."""
        found = [_lora_of(m) for m in modules]
        parts = [p for p in found if p is not None]
        if len(parts) < len(found):
            return None
        for m, (_, lora) in zip(modules, parts, strict=True):
            adapters = getattr(m, "lora_A", {})
            own = adapters[self.folds.adapter] if self.folds.adapter in adapters else None
            if lora is not None and (own is None or lora[0] is not own.weight):
                return None  # another adapter: the folds track only the own one
        bases = [p[0].weight for p in parts]
        if bases[0].device.type != "cpu" or any(w.dtype != torch.float32 for w in bases):
            return None
        out, inp = sum(w.shape[0] for w in bases), bases[0].shape[1]
        block = blocked_layout(out, inp, self.rows_hint)
        if block is None:
            return None
        bias = _joined_bias(bases, [p[0].bias for p in parts])

        def fold(packed: _FoldedPacked) -> None:
            packed.fold(_stacked_lora([p[1] for p in parts], [w.shape[0] for w in bases]))

        def make() -> _FoldedPacked:
            packed = _FoldedPacked([w.detach() for w in bases], block, self.rows_hint)
            fold(packed)
            return packed

        packed = self.folded.get(bases, make if create else None, fold)
        return None if packed is None else (packed.tensor, bias, out)


def low_precision_problem(precision: str, model) -> str | None:
    """Why the sampler cannot run `model` at `precision` ("int8", "bfloat16") here; None if it can."""
    if precision == "int8" and not hasattr(torch, "_weight_int8pack_mm"):
        return "this torch has no int8 weight-only matmul (torch._weight_int8pack_mm)"
    if precision == "bfloat16" and not onednn_available():
        return "this torch has no oneDNN prepacked linear"
    if precision == "bfloat16" and not cpu_packs_bfloat16():
        return "oneDNN's bfloat16 weights need a CPU with AVX512 (bw, vl, dq) or AVX-NE-CONVERT, and this one has neither"
    param = next(model.parameters())
    if param.device.type != "cpu":
        return f"its kernels run on the CPU, and the model is on {param.device}"
    if param.dtype != torch.float32:
        return f"it samples a float32 model, and this one is {str(param.dtype).removeprefix('torch.')}"
    return None


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output row: (q [out, in] int8, scale [out]) with weight ~ q * scale[:, None].

    scale = max |w_row| / 127, q = round(w / scale) in [-127, 127]; a row of zeros gets scale 1.

    >>> q, s = quantize_rows(torch.tensor([[0.5, -1.0], [0.0, 0.0]]))
    >>> q.tolist(), [round(x, 5) for x in s.tolist()]
    ([[64, -127], [0, 0]], [0.00787, 1.0])
    """
    scale = weight.abs().amax(dim=1) / 127.0  # [out]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8)  # [out, in]
    return q, scale


def _lora_of(module: nn.Module) -> tuple[nn.Linear, tuple[torch.Tensor, torch.Tensor, float] | None] | None:
    """(base linear, its active LoRA (A [r, in], B [out, r], scale) or None) of a layer the
    low-precision kernels can run, or None: several active adapters, dropout, DoRA, a LoRA bias."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    if not isinstance(module, LoraLayer):
        return (module, None) if type(module) is nn.Linear else None
    if module.merged:
        return None  # its base weight holds an update: not the base that was converted
    base = module.get_base_layer()
    if type(base) is not nn.Linear:
        return None
    active = [a for a in module.active_adapters if a in module.lora_A]
    if module.disable_adapters or not active:
        return base, None
    if len(active) > 1 or not isinstance(module, LoraLinear) or module.fan_in_fan_out:
        return None
    name = active[0]
    if (
        module.use_dora.get(name, False)
        or module.lora_bias.get(name, False)
        or not isinstance(module.lora_dropout[name], nn.Identity)
    ):
        return None
    a, b = cast(nn.Linear, module.lora_A[name]), cast(nn.Linear, module.lora_B[name])
    return base, (a.weight, b.weight, float(module.scaling[name]))


class LowPrecisionKernels:
    """The base weights in int8 or bfloat16 for sampling, the LoRA adapter in float32 on top.

    - "int8": weight-only int8, one scale per output row (`quantize_rows`), through
      `torch._weight_int8pack_mm` (the kernel torchao's int8 weight-only layout calls on CPU),
      with the activations rounded to bfloat16 for it (its float32 path is not vectorized);
    - "bfloat16": the weights in bfloat16, prepacked for oneDNN (`PackedKernels`' ops), the
      activations rounded to bfloat16.
    Either way the products accumulate in float32 and the bias is added in float32. The
    activations are not quantized to int8: SmolLM2's MLP activations have outlier channels, and
    fbgemm's dynamic int8 linear (one activation scale per batch) put its next-token distribution
    1.25 nats of KL away from float32 on `capitals` prompts (docs/speed.md). The adapter of each layer, `s (x A^T) B^T`,
    runs in float32 on the unrounded input: a group of layers is one `A` of their stacked ranks
    and one block-diagonal `s B`, built afresh per batch (small), so the adapter a batch samples
    with is the one the trainer holds. The converted base weights are made once and kept.
    """

    def __init__(self, precision: str, stamp: Stamp = version_stamp, rows_hint: int = 8):
        if precision not in ("int8", "bfloat16"):
            raise ValueError(f"precision {precision!r}: use int8 or bfloat16")
        self.precision = precision
        # int8: (q, scale); bfloat16: the packed weight
        self.converted: _Prepared[tuple[torch.Tensor, torch.Tensor] | torch.Tensor] = _Prepared(stamp)
        self.rows_hint = rows_hint

    def _convert(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        weight = weight.detach().float()
        if self.precision == "int8":
            q, scale = quantize_rows(weight)
            return q, scale.to(torch.bfloat16)
        return torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16), self.rows_hint)

    def group(self, modules: list[nn.Module]) -> Runner | None:
        found = [_lora_of(m) for m in modules]
        parts = [p for p in found if p is not None]
        if len(parts) < len(found):
            return None
        bases = [p[0] for p in parts]
        weights = [b.weight for b in bases]
        if weights[0].device.type != "cpu" or any(w.dtype != torch.float32 for w in weights):
            return None
        out = sum(w.shape[0] for w in weights)
        bias = _joined_bias(weights, [b.bias for b in bases])
        converted = self.converted.get(
            weights, lambda: self._convert(weights[0] if len(weights) == 1 else torch.cat(weights))
        )
        lora = _stacked_lora([p[1] for p in parts], [w.shape[0] for w in weights])
        int8 = self.precision == "int8"

        def run(x: torch.Tensor, transposed: bool) -> torch.Tensor:
            rows = x.shape[0]
            x2 = x.reshape(rows, -1)  # [R, in]
            xb = x2.to(torch.bfloat16)
            if int8:
                q, scale = cast(tuple[torch.Tensor, torch.Tensor], converted)
                y = torch._weight_int8pack_mm(xb, q, scale).float()  # [R, out]
            else:
                y = torch.ops.mkldnn._linear_pointwise(xb, converted, None, "none", [], "").float()
            if bias is not None:
                y = y + bias
            if lora is not None:
                a, b = lora
                y = torch.addmm(y, x2 @ a.t(), b.t())  # + s (x A^T) B^T, in float32
            return y.reshape(rows, 1, out)

        return run


def _stacked_lora(
    adapters: list[tuple[torch.Tensor, torch.Tensor, float] | None], outs: list[int]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(A [sum r, in], s B [sum out, sum r] block-diagonal) of a group's adapters; None if it has none."""
    present = [a for a in adapters if a is not None]
    if not present:
        return None
    ranks = [a[0].shape[0] if a is not None else 0 for a in adapters]
    first = present[0][0]
    a_all = torch.cat([a[0].detach() for a in present])  # [sum r, in]
    b_all = first.new_zeros((sum(outs), sum(ranks)))  # [sum out, sum r]
    row = col = 0
    for adapter, out, rank in zip(adapters, outs, ranks, strict=True):
        if adapter is not None:
            b_all[row : row + out, col : col + rank] = adapter[1].detach() * adapter[2]
        row, col = row + out, col + rank
    return a_all, b_all
