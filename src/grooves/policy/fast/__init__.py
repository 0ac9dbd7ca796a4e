"""CPU speed paths of the transformers policy, chosen in one place by one setting: `model.fast`.

Each path computes the same function as plain transformers + peft, in fewer or larger operations:

- fused decode (`decode.py`): Llama/Qwen2 decode steps on a lean forward of our own;
- packed decode (`kernels.py`): that forward's matmuls on oneDNN with weights prepacked once,
  instead of MKL's sgemm, which reads the weights far below the memory bandwidth at a few rows;
- folded LoRA (`merged.py`): sampling on W + s B A, one matmul per layer instead of three;
  with the packed decode on a CPU whose packed layout is a plain block array, folded straight
  into the packed weights (`kernels._FoldedPacked`), with no dense folded copy;
- the prompt on the packed weights too (`decode.FusedPrefill`);
- allocator reuse (`allocator.py`): glibc keeps the big blocks torch frees for reuse;
- LoRA addmm (`lora_addmm.py`): training's LoRA layers as one `addmm` each;
- the trainer's forward on the sampler's packed weights (`packed_training.py`): each group of
  layers on one input as one matmul on the packed fold, the backward LoRA's own, and the output
  head on its packed copy;
- timed matmul forms (`output_head.py`, `decode.MatmulPlan`): a decode matmul run as `x W^T` or as
  `(W x^T)^T`, whichever a timing found faster at that row count.

`model.fast` (`FastMode`):

- "on" (the default): every path except the timed forms. Every matmul runs `x W^T`, so nothing
  depends on a timing: two runs of one seed are bit-identical where batching allows.
- "timed": also the output head's matmul form, timed once per decode row count. Faster decoding
  on some CPUs; a choice timed on a busy machine can differ between two runs of one seed, which
  then sample other tokens and drift apart.
- "off": plain transformers + peft: transformers' forward for every decode step, peft's LoRA
  layers for sampling and training, glibc's malloc defaults.

`model.sampler_precision` ("int8", "bfloat16") is not one of these: it samples a different function
(int8 or bfloat16 base weights, `kernels.LowPrecisionKernels`) on the fused decode, and the trainer corrects for it
(`algorithm.tis_cap`). It is chosen here too, with the paths it needs.

The sampler (`policy.sampling.Sampler`) and the policy's training phase ask this module what to
use; nothing else in grooves imports a speed module. docs/speed.md measures each path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, get_args

import torch

from grooves.config import FastMode, SamplerPrecision
from grooves.policy.fast import allocator
from grooves.policy.fast.decode import (
    FusedPrefill,
    MatmulPlan,
    decoder_for,
    prefill_for,
    projection_groups,
    supports,
)
from grooves.policy.fast.kernels import (
    LowPrecisionKernels,
    PackedKernels,
    PlainKernels,
    blocked_layout,
    low_precision_problem,
    onednn_available,
    version_stamp,
)
from grooves.policy.fast.lora_addmm import addmm_lora
from grooves.policy.fast.merged import MergedWeights
from grooves.policy.fast.output_head import PlannedHead
from grooves.policy.fast.packed_training import on_packed_weights


@dataclass(frozen=True)
class FastPaths:
    """Which speed paths a policy uses. `fast_paths(mode)` gives the one `model.fast` names; the
    benchmarks build others (e.g. `timed_blocks`, which no mode turns on) to measure them."""

    fused_decode: bool = True
    packed_decode: bool = True
    fold_lora: bool = True
    reuse_freed_memory: bool = True
    lora_addmm: bool = True
    timed_head: bool = False
    timed_blocks: bool = False


MODES: dict[str, FastPaths] = {
    "on": FastPaths(),
    "timed": FastPaths(timed_head=True),
    "off": FastPaths(
        fused_decode=False, packed_decode=False, fold_lora=False, reuse_freed_memory=False, lora_addmm=False
    ),
}


def fast_paths(mode: FastMode | FastPaths) -> FastPaths:
    """The paths `model.fast = mode` turns on (a `FastPaths` is taken as it is)."""
    if isinstance(mode, FastPaths):
        return mode
    if mode not in MODES:
        raise ValueError(f"model.fast = {mode!r}: use one of {', '.join(get_args(FastMode))}")
    return MODES[mode]


def before_load(paths: FastPaths, device: str) -> None:
    """Process settings to make before the model's weights and its first step's temporaries exist."""
    if paths.reuse_freed_memory and torch.device(device).type == "cpu":
        allocator.reuse_freed_memory()


@contextlib.contextmanager
def training(
    paths: FastPaths, model: torch.nn.Module, sampling: FastSampling | None = None
) -> Iterator[None]:
    """The training speed paths for an optimizer step's span: LoRA layers as one `addmm`, and,
    where `sampling` folds the adapter into its packed weights, the forward on those and on the
    packed output head (`packed_training.py`)."""
    with contextlib.ExitStack() as stack:
        if paths.lora_addmm:
            stack.enter_context(addmm_lora(model))
            folded = sampling.trainer_folds(model) if sampling is not None else None
            if folded is not None:
                stack.enter_context(folded)
        yield


def sampler_problem(precision: SamplerPrecision, paths: FastPaths, model: torch.nn.Module) -> str | None:
    """Why `model.sampler_precision = precision` cannot sample `model` with these paths; None if it can."""
    if precision == "float32":
        return None
    if not paths.fused_decode:
        return 'it runs on the fused decode forward, which model.fast = "off" turns off'
    if not supports(model):
        kind = getattr(getattr(model, "config", None), "model_type", "?")
        sliding = " with sliding-window layers" if kind in ("llama", "qwen2") else ""
        return f"it samples llama and qwen2 models with full attention, and this one is {kind}{sliding}"
    return low_precision_problem(precision, model)


def _blocks_are_plain(model: torch.nn.Module) -> bool:
    """oneDNN lays each of the fused forward's weight groups of this model (q/k/v, o, gate/up,
    down) out as a plain block array on this CPU (`kernels.blocked_layout`), so the packed kernels
    can write a folded adapter into them; else they pack a dense fold (a group they could not
    fold into would run as peft's layers)."""
    config: Any = getattr(model, "config", None)  # None fails below, as AttributeError
    try:
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        inner = int(config.intermediate_size)
    except (AttributeError, TypeError, ValueError):
        return False
    groups = [
        ((heads + 2 * kv_heads) * head_dim, hidden),  # q, k, v
        (hidden, heads * head_dim),  # o
        (2 * inner, hidden),  # gate, up
        (hidden, inner),  # down
    ]
    return all(blocked_layout(out, inp, 8) is not None for out, inp in groups)


class FastSampling:
    """The sampling speed paths of one policy, with what they keep between batches: the folded
    weights, the packed or quantized weights, and the forms timing chose."""

    def __init__(
        self,
        paths: FastPaths,
        model: torch.nn.Module,
        *,
        own_adapter: bool,
        precision: SamplerPrecision = "float32",
    ):
        problem = sampler_problem(precision, paths, model)
        if problem is not None:
            raise ValueError(f'model.sampler_precision = "{precision}": {problem}; use "float32"')
        self.paths = paths
        self.precision = precision
        fold = paths.fold_lora and own_adapter and precision == "float32"
        packed = self._packs(model)
        # where the packed kernels can fold the adapter into their packed copies themselves, no
        # dense folded copy of the weights is made (merged.py); else the kernels pack that copy
        fold_in_packed = (
            fold and packed and paths.fused_decode and supports(model) and _blocks_are_plain(model)
        )
        self.merged = MergedWeights(model) if fold else None
        """The own adapter folded into copies of the base weights (see `merged.py`); None: peft's layers."""
        if (
            fold_in_packed and self.merged is not None and self.merged.supported
        ):  # one that folds nothing stays dense: no one waits on it
            self.merged.dense = False
        self.head = PlannedHead() if paths.timed_head else None
        """The output head's matmul form per decode row count, timed once (see `output_head.py`); None: `x W^T`."""
        self.plan = MatmulPlan() if paths.timed_blocks else None
        """The fused forward's matmul forms per row count, timed on decode steps; None: `x W^T`, untimed."""
        self.kernels = self._kernels(packed)
        """What runs the fused forward's matmuls (see `kernels.py`); it keeps its packed weights."""
        self._prefill: FusedPrefill | None = None
        """The last batch's fused prefill: its decode steps run on the same blocks."""

    def _packs(self, model: torch.nn.Module) -> bool:
        """The float32 fused forward runs on oneDNN's packed weights (`PackedKernels`)."""
        on_cpu = next(model.parameters()).device.type == "cpu"
        return (
            self.precision == "float32"
            and self.paths.packed_decode
            and not self.paths.timed_blocks
            and on_cpu
            and onednn_available()
        )

    def _kernels(self, packed: bool):
        if self.precision != "float32":
            return LowPrecisionKernels(self.precision)
        if not packed:
            return PlainKernels()
        if self.merged is not None and not self.merged.dense:
            return PackedKernels(folds=self.merged)
        return PackedKernels(self.merged.stamp if self.merged is not None else version_stamp)

    @property
    def folded(self) -> bool:
        """The policy's own weights sample on folded buffers."""
        return self.merged is not None and self.merged.supported

    def folded_weights(self) -> contextlib.AbstractContextManager:
        assert self.merged is not None  # called where `folded`
        return self.merged.applied()

    def trainer_folds(self, model: torch.nn.Module) -> contextlib.AbstractContextManager | None:
        """The trainer's forward on these packed folded weights and packed output head
        (`packed_training.on_packed_weights`), or None where the kernels do not fold the adapter
        into their packed copies."""
        kernels = self.kernels
        if not (isinstance(kernels, PackedKernels) and kernels.folds is not None):
            return None
        groups = projection_groups(model)
        if groups is None:
            return None
        merged = kernels.folds
        return on_packed_weights(
            model,
            [g for layer in groups for g in layer],
            kernels.training_fold,
            merged.refresh,
            merged.adapter,
            kernels.training_packed,
        )

    def output_head(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        return self.head.applied(model) if self.head is not None else contextlib.nullcontext()

    def prefill(self, model):
        """The forward a batch's prompts run on: the fused one on packed weights, or None (the
        model's own; `PlainKernels` would run the same MKL matmuls as transformers does)."""
        self._prefill = None
        if not (self.paths.fused_decode and isinstance(self.kernels, PackedKernels)):
            return None
        self._prefill = prefill_for(model, self.kernels)
        return self._prefill

    def decoder(self, model, cache, mask: torch.Tensor, capacity: int):
        """The decode steps after a prefill (see `policy.sampling.sample`); after `prefill`'s forward
        left this `cache`, on that forward's blocks instead of reading the layers again."""
        prefilled, self._prefill = self._prefill, None
        blocks = prefilled.blocks if prefilled is not None and prefilled.cache is cache else None
        return decoder_for(
            model,
            cache,
            mask,
            capacity,
            fused=self.paths.fused_decode,
            plan=self.plan,
            kernels=self.kernels,
            blocks=blocks,
        )
