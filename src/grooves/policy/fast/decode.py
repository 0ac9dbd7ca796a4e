"""The sampler's lean decode forward for Llama-family models, the same function in fewer ops.

A decode step at 8 rows is a few hundred tiny ops, and on a CPU their count, not their FLOPs,
sets its time. `FusedDecode` computes the same function as transformers' Llama/Qwen2 forward
with fewer and larger ops:
- q, k and v as one matmul, and gate and up as one, when their weights lie back to back in one
  buffer (the folded LoRA weights do, see `policy/fast/merged.py`), instead of five matmuls per block;
- a KV cache allocated once for the whole completion and written in place (transformers'
  `DynamicCache` concatenates, copying the cache at every step);
- RMSNorm as `F.rms_norm`, one kernel instead of five ops; the left-padding mask made once.

It covers `llama` and `qwen2` models with full attention in every layer; for other models (or
`fused=False`) `decoder_for` returns the sampler's plain `TransformersDecode`, transformers'
forward with a `DynamicCache`. A layer that is not a plain weight (an active peft LoRA layer: sampling an extra
adapter, or the unfolded path) is called as the module it is, so the result is the same function
in every case. It matches transformers' logits up to float rounding (tests/policy/test_decode.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from grooves.policy.fast.kernels import PlainKernels, Runner
from grooves.policy.sampling import TransformersDecode

if TYPE_CHECKING:
    from transformers import Cache

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


def decoder_for(
    model,
    cache,
    mask: torch.Tensor,
    capacity: int,
    *,
    fused: bool = True,
    plan: MatmulPlan | None = None,
    kernels=None,
    blocks: list[_Block] | None = None,
):
    """The decode steps to run after a prefill that left `cache` and `mask` [R, P]; `capacity`
    bounds the sequence length (prompt width + the most new tokens any row may take). `kernels`
    runs the fused forward's matmuls (`policy/fast/kernels.py`; default `PlainKernels`); `blocks`,
    those of a fused prefill of this batch on the same kernels (None: read from the model)."""
    if fused:
        blocks = blocks if blocks is not None else _blocks_of(model, kernels or PlainKernels())
        if blocks is not None:
            return FusedDecode(model, blocks, cache, mask, capacity, plan, kernels)
    return TransformersDecode(model, cache, mask)


def prefill_for(model, kernels):
    """The fused prefill forward (`FusedPrefill`) of a supported model on `kernels`, else None."""
    blocks = _blocks_of(model, kernels)
    return None if blocks is None else FusedPrefill(model, blocks, kernels)


class MatmulPlan:
    """Per row count, whether a decode step's block matmuls run as `(W x^T)^T` or `x W^T`, chosen
    by timing real decode steps.

    At a few rows the two forms are the same product through different BLAS kernels, and which is
    faster depends on the CPU, the row count and what else the step does: a loop over the blocks'
    weights alone can favour the form that real decode steps run slower (CHANGELOG.md, change 14).
    So the plan times the decode steps themselves: the first `trials` steps at each row count in
    each form, alternating, then the faster (by a clear margin, else `x W^T`). Nothing extra
    runs; the plan persists across batches.

    Without a plan every step runs `x W^T`, untimed: the two forms round differently, and a choice
    made by timing can differ between two runs of one seed, which then sample different tokens.
    No `model.fast` value turns it on; the benchmarks do (`FastPaths(timed_blocks=True)`).
    """

    def __init__(self, trials: int = 2, margin: float = 0.9):
        self.trials, self.margin = trials, margin
        self._seconds: dict[int, dict[bool, list[float]]] = {}
        self._chosen: dict[int, bool] = {}

    def form(self, rows: int) -> bool:
        """True: run this row count's step as `(W x^T)^T`."""
        if rows in self._chosen:
            return self._chosen[rows]
        seen = self._seconds.setdefault(rows, {False: [], True: []})
        return len(seen[True]) < len(seen[False])

    def record(self, rows: int, transposed: bool, seconds: float) -> None:
        if rows in self._chosen:
            return
        seen = self._seconds[rows]
        seen[transposed].append(seconds)
        if all(len(seen[f]) >= self.trials for f in (False, True)):
            # the minimum: a busy machine only ever adds time
            self._chosen[rows] = min(seen[True]) < self.margin * min(seen[False])

    def chosen(self) -> dict[int, bool]:
        """The forms decided so far, by row count."""
        return dict(self._chosen)

    def timed(self) -> bool:
        """A decode step has been timed."""
        return bool(self._seconds)

    def fix(self, forms: dict[int, bool]) -> None:
        """Run these row counts in these forms (True: `(W x^T)^T`) instead of timing them."""
        self._chosen.update(forms)


# ---- the lean forward ------------------------------------------------------------------------


class _Projections:
    """Linear layers on the same input: one kernel call for the group where the kernels can run
    it, else each layer on its own (a kernel call, or the module itself, e.g. an active peft LoRA)."""

    def __init__(self, modules: list[nn.Module], kernels):
        self.sizes = [int(cast(torch.Tensor, m.weight).shape[0]) for m in modules]  # out_features
        self.fused: Runner | None = kernels.group(modules)
        self.parts: list[Runner | nn.Module] = []
        if self.fused is None:
            self.parts = [kernels.group([m]) or m for m in modules]

    def __call__(self, x: torch.Tensor, transposed: bool = False) -> list[torch.Tensor]:
        if self.fused is not None:
            y = self.fused(x, transposed)
            return list(y.split(self.sizes, dim=-1)) if len(self.sizes) > 1 else [y]
        return [p(x) if isinstance(p, nn.Module) else p(x, transposed) for p in self.parts]


class _Norm:
    """RMSNorm `w * x / sqrt(mean(x^2) + eps)`, as one kernel when the module is the usual one."""

    def __init__(self, module: nn.Module):
        fusable = type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")
        self.module: nn.Module | None = None if fusable else module
        self.weight = cast(torch.Tensor, module.weight) if fusable else None
        self.eps = float(cast(float, module.variance_epsilon)) if fusable else 0.0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.module is not None:
            return self.module(x)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


@dataclass
class _Block:
    norm1: _Norm
    qkv: _Projections
    o: _Projections
    norm2: _Norm
    gate_up: _Projections
    down: _Projections
    act: nn.Module
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float


def _base(model) -> Any:
    """The transformers model under a peft wrapper (or the model itself). Any: its submodules are
    read by name (`model.layers`, `self_attn.q_proj`, ...), which `supports` checks it has."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def supports(model) -> bool:
    """The fused forward runs this model (Llama/Qwen2 with full attention in every layer)."""
    base = _base(model)
    if base.config.model_type not in SUPPORTED_MODEL_TYPES:
        return False
    if any(t != "full_attention" for t in getattr(base.config, "layer_types", None) or []):
        return False  # sliding-window layers: left to transformers' masks
    inner = getattr(base, "model", None)
    return inner is not None and all(
        hasattr(inner, a) for a in ("layers", "embed_tokens", "norm", "rotary_emb")
    )


def projection_groups(model) -> list[tuple[list[nn.Module], ...]] | None:
    """Per decoder layer of a supported model, its linear layers in groups that read one input, in
    the order its forward calls them: ([q, k, v], [o], [gate, up], [down]); None if it is not one."""
    if not supports(model):
        return None
    groups: list[tuple[list[nn.Module], ...]] = []
    for layer in _base(model).model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if not all(hasattr(mlp, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return None
        groups.append(
            (
                [attn.q_proj, attn.k_proj, attn.v_proj],
                [attn.o_proj],
                [mlp.gate_proj, mlp.up_proj],
                [mlp.down_proj],
            )
        )
    return groups


def _blocks_of(model, kernels=None) -> list[_Block] | None:
    """The blocks of a supported model, read for this batch's weights; None if the model is not one."""
    kernels = kernels or PlainKernels()
    base = _base(model)
    config = base.config
    if not supports(model) or base.training:
        return None
    groups = projection_groups(model)
    if groups is None:
        return None
    blocks = []
    for layer, (qkv, o, gate_up, down) in zip(base.model.layers, groups, strict=True):
        attn, mlp = layer.self_attn, layer.mlp
        heads = config.num_attention_heads
        blocks.append(
            _Block(
                norm1=_Norm(layer.input_layernorm),
                qkv=_Projections(qkv, kernels),
                o=_Projections(o, kernels),
                norm2=_Norm(layer.post_attention_layernorm),
                gate_up=_Projections(gate_up, kernels),
                down=_Projections(down, kernels),
                act=mlp.act_fn,
                heads=heads,
                kv_heads=config.num_key_value_heads,
                head_dim=attn.head_dim,
                scaling=float(attn.scaling),
            )
        )
    return blocks


class FusedDecode:
    """Decode steps of a Llama-family model in few, large ops, on a KV cache of fixed capacity."""

    def __init__(
        self,
        model,
        blocks: list[_Block],
        cache,
        mask: torch.Tensor,
        capacity: int,
        plan: MatmulPlan | None = None,
        kernels=None,
    ):
        base = _base(model)
        self.blocks = blocks
        self.plan = (
            plan if mask.device.type == "cpu" else None
        )  # host timers cannot time asynchronous GPU kernels
        self.embed, self.norm = base.model.embed_tokens, _Norm(base.model.norm)
        self.rotary = base.model.rotary_emb
        head = model.get_output_embeddings()  # a `PlannedLinear` while a timed head samples
        self.head = _Projections([head], kernels) if kernels is not None else None
        """The output head through the kernels; None: called as the module (`PlainKernels` is
        `F.linear` either way, and a timed head keeps its own form)."""
        self.head_module = head
        rows, width = mask.shape
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        for i, b in enumerate(blocks):
            layer = cache.layers[i]
            k, v = layer.keys, layer.values  # [R, KV, P, hd]
            self.keys.append(k.new_empty((rows, b.kv_heads, capacity, b.head_dim)))
            self.values.append(v.new_empty((rows, b.kv_heads, capacity, b.head_dim)))
            self.keys[-1][:, :, :width] = k
            self.values[-1][:, :, :width] = v
            # the prefill's layer is emptied once copied, so the two caches never coexist whole
            # (on long chats each is gigabytes); the caller drops the emptied cache
            layer.keys, layer.values = k.new_empty(0), v.new_empty(0)
            del k, v
        self.length = width
        """Columns of the cache filled so far; the same for every row (prompts are left-padded)."""
        self.bias: torch.Tensor | None = None
        """[R, capacity] added to the attention scores: -inf at left padding; None when there is none."""
        if not bool(mask.all()):
            dtype = self.keys[0].dtype if blocks else torch.float32
            self.bias = torch.zeros((rows, capacity), dtype=dtype, device=mask.device)
            self.bias[:, :width].masked_fill_(mask == 0, float("-inf"))

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (tokens, positions: [R]); returns the next-token logits [R, V] in float32."""
        if self.plan is None:
            return self._step(tokens, positions, transposed=False)
        transposed = self.plan.form(len(tokens))
        start = time.perf_counter()
        logits = self._step(tokens, positions, transposed)
        self.plan.record(len(tokens), transposed, time.perf_counter() - start)
        return logits

    def _step(self, tokens: torch.Tensor, positions: torch.Tensor, transposed: bool) -> torch.Tensor:
        if self.length >= self.keys[0].shape[2]:
            raise RuntimeError(
                f"the KV cache holds {self.length} tokens, its capacity; size it for the longest completion"
            )
        col = self.length
        h = self.embed(tokens[:, None])  # [R, 1, D]
        cos, sin = self.rotary(h, positions[:, None])  # [R, 1, hd]
        bias = self.bias[:, None, None, : col + 1] if self.bias is not None else None

        def attend(i: int, b: _Block, q, k, v):  # q [R, H, 1, hd], k and v [R, KV, 1, hd]
            keys, values = self.keys[i], self.values[i]
            keys[:, :, col] = k[:, :, 0]
            values[:, :, col] = v[:, :, 0]
            return F.scaled_dot_product_attention(
                q,
                keys[:, :, : col + 1],
                values[:, :, : col + 1],
                attn_mask=bias,
                scale=b.scaling,
                enable_gqa=b.heads != b.kv_heads,
            )

        h = run_blocks(self.blocks, h, cos, sin, attend, transposed)
        self.length += 1
        h = self.norm(h)
        logits = (
            self.head(h)[0] if self.head is not None else self.head_module(h)
        )  # the head's own form, untimed
        return logits[:, 0].float()

    def keep(self, index: torch.Tensor) -> None:
        """Keep only these rows (finished rows leave the batch), a layer at a time: each old
        layer is freed before the next is copied."""
        for i in range(len(self.keys)):
            self.keys[i] = self.keys[i].index_select(0, index)
            self.values[i] = self.values[i].index_select(0, index)
        if self.bias is not None:
            self.bias = self.bias.index_select(0, index)


@dataclass
class PrefillOutput:
    """What `_prefill` reads of a forward's output."""

    past_key_values: object
    logits: torch.Tensor


class FusedPrefill:
    """The prompt's forward (the sampler's prefill) on the fused blocks and their kernels.

    Called as the sampler's prefill calls the model (`policy.sampling._prefill`): ids [U, T] on
    a transformers `DynamicCache` of the columns before them (or none), with the 2-D attention mask
    of all columns and the positions; returns the cache and the logits of `logits_to_keep`. With
    `PackedKernels` a prompt's matmuls run on the packed weights the decode steps use, which
    oneDNN runs faster than MKL at a prompt's few dozen rows too (docs/speed.md), and the dense
    folded weights then need not exist for sampling at all. The same function as transformers'
    forward up to float rounding (tests/policy/test_decode.py).
    """

    def __init__(self, model, blocks: list[_Block], kernels):
        base = _base(model)
        self.blocks = blocks
        self.embed, self.norm = base.model.embed_tokens, _Norm(base.model.norm)
        self.rotary = base.model.rotary_emb
        self.head = _Projections([model.get_output_embeddings()], kernels)
        self.cache: Cache | None = None
        """The cache the last call returned."""

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values=None,
        use_cache: bool = True,
        logits_to_keep: torch.Tensor | None = None,
    ) -> PrefillOutput:
        from transformers import DynamicCache

        rows, width = input_ids.shape
        device = input_ids.device
        cache = past_key_values if past_key_values is not None else DynamicCache()
        past = cache.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + width, device=device).expand(rows, -1)
        h = self.embed(input_ids)  # [U, T, D]
        cos, sin = self.rotary(h, position_ids)  # [U, T, hd]
        columns = torch.arange(past + width, device=device)
        at = columns[past:, None]  # [T, 1]: each query's own column
        allowed = columns[None, :] <= at  # [T, P + T]: causal
        if attention_mask is not None:
            # left padding is seen by no query; a padding query sees itself, so no row is all -inf
            allowed = (allowed & attention_mask[:, None, :].bool()) | (columns[None, :] == at)  # [U, T, P+T]
        bias = torch.zeros(allowed.shape, dtype=h.dtype, device=device).masked_fill_(~allowed, float("-inf"))
        bias = bias[:, None] if bias.ndim == 3 else bias  # [U, 1, T, P + T] or [T, P + T]

        def attend(i: int, b: _Block, q, k, v):
            keys, values = cache.update(k, v, i)  # [U, KV, P + T, hd]
            return F.scaled_dot_product_attention(
                q, keys, values, attn_mask=bias, scale=b.scaling, enable_gqa=b.heads != b.kv_heads
            )

        h = run_blocks(self.blocks, h, cos, sin, attend)
        if logits_to_keep is not None:
            h = h[:, logits_to_keep]  # [U, K, D]
        h = self.norm(h)
        (logits,) = self.head(h.reshape(-1, 1, h.shape[-1]))  # [U K, 1, V]
        self.cache = cache
        return PrefillOutput(cache, logits.view(rows, -1, logits.shape[-1]))


def run_blocks(
    blocks: list[_Block], h: torch.Tensor, cos, sin, attend, transposed: bool = False
) -> torch.Tensor:
    """The decoder blocks on hidden states h [R, T, D] at rotary cos, sin [R, T, hd]; `attend(i, block,
    q [R, H, T, hd], k, v [R, KV, T, hd])` stores block i's new keys and values wherever its cache
    is and returns the attention [R, H, T, hd]. The same function as transformers' Llama block."""
    rows, width = h.shape[:2]
    n = rows * width
    cos, sin = cos[:, None], sin[:, None]  # [R, 1, T, hd]: the same rotation for every head
    for i, b in enumerate(blocks):
        x = b.norm1(h).reshape(n, 1, -1)
        if b.qkv.fused is not None:  # q and k lie side by side in one output: rotated as one tensor
            y = b.qkv.fused(x, transposed)  # [n, 1, (H + 2 KV) hd]
            split = (b.heads + b.kv_heads) * b.head_dim
            qk = y[..., :split].reshape(rows, width, b.heads + b.kv_heads, b.head_dim).transpose(1, 2)
            qk = qk * cos + _rotate_half(qk) * sin  # [R, H + KV, T, hd]
            q, k = qk[:, : b.heads], qk[:, b.heads :]
            v = y[..., split:].reshape(rows, width, b.kv_heads, b.head_dim).transpose(1, 2)
        else:
            q, k, v = b.qkv(x, transposed)
            q = q.reshape(rows, width, b.heads, b.head_dim).transpose(1, 2)  # [R, H, T, hd]
            k = k.reshape(rows, width, b.kv_heads, b.head_dim).transpose(1, 2)  # [R, KV, T, hd]
            v = v.reshape(rows, width, b.kv_heads, b.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        a = attend(i, b, q, k, v)
        (o,) = b.o(a.transpose(1, 2).reshape(n, 1, b.heads * b.head_dim), transposed)
        h = h + o.view(rows, width, -1)
        gate, up = b.gate_up(b.norm2(h).reshape(n, 1, -1), transposed)
        (down,) = b.down(b.act(gate) * up, transposed)
        h = h + down.view(rows, width, -1)
    return h


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)
