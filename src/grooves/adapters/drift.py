"""`grooves weights diff A B`: how far each adapter moves the base weights, layer by layer.

A LoRA adapter changes a base weight W [out, in] by dW = s B A, with A [r, in], B [out, r] and
scale s = alpha / r (alpha / sqrt(r) with rank-stabilized LoRA; Hu et al. 2021, arXiv 2106.09685;
Kalajdzievski 2023, arXiv 2312.03732). We report ||dW||_F / ||W||_F per layer: a scale-free
"how much did this layer change". RL fine-tuning has been observed to make small, sparse updates compared
with SFT for similar task gains (Mukherjee et al. 2025, "Reinforcement Learning Finetunes Small
Subnetworks in Large Language Models"); this table is how a user checks that on their own adapters.

dW is never materialized. Frobenius norms and inner products of low-rank products reduce to
r x r matrices:

    ||s B A||_F^2         = s^2 tr((B^T B)(A A^T))
    <s B A, t D C>_F      = s t tr((B^T D)(C A^T))
    ||s B A - t D C||_F^2 = ||s B A||^2 + ||t D C||^2 - 2 <s B A, t D C>

so a 576 x 1536 layer costs a few r x r products, and the base weights are read one tensor at a
time from their safetensors files (no model is built). Groups (a transformer block, a projection
kind, the whole model) aggregate by summing squares: ||dW_group|| = sqrt(sum ||dW_i||^2).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from grooves.adapters.export import adapter_base_model
from grooves.models import resolve_model

Group = Literal["module", "block", "kind", "total"]
_PREFIX = "base_model.model."


class DriftError(ValueError):
    """An adapter this table cannot describe (e.g. DoRA), or base weights that don't match it."""


@dataclass(frozen=True)
class LoraFactors:
    """One adapted layer: dW = scale * B @ A."""

    a: torch.Tensor  # [r, in] float64
    b: torch.Tensor  # [out, r] float64
    scale: float


def lora_scale(alpha: float, rank: int, use_rslora: bool = False) -> float:
    """peft's LoRA scaling: alpha / r, or alpha / sqrt(r) with rank-stabilized LoRA."""
    return alpha / math.sqrt(rank) if use_rslora else alpha / rank


def update_sq_norm(f: LoraFactors) -> float:
    """||s B A||_F^2 = s^2 tr((B^T B)(A A^T))."""
    return f.scale**2 * float(torch.trace((f.b.T @ f.b) @ (f.a @ f.a.T)))


def update_inner(f: LoraFactors, g: LoraFactors) -> float:
    """<s B A, t D C>_F = s t tr((B^T D)(C A^T)) for f = (A, B, s), g = (C, D, t)."""
    return f.scale * g.scale * float(torch.trace((f.b.T @ g.b) @ (g.a @ f.a.T)))


def read_lora(adapter_dir: str | Path) -> dict[str, LoraFactors]:
    """The LoRA factors of a peft adapter folder, keyed by the base weight's name."""
    from peft.utils.other import get_pattern_key
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    if config.get("peft_type") != "LORA":
        raise DriftError(
            f"{adapter_dir}: peft_type={config.get('peft_type')!r}; only LoRA adapters are supported"
        )
    if config.get("use_dora"):
        raise DriftError(
            f"{adapter_dir}: use_dora=true; DoRA rescales W itself, so ||B A|| does not measure its update"
        )
    if config.get("modules_to_save"):
        raise DriftError(
            f"{adapter_dir}: modules_to_save={config['modules_to_save']}; fully trained modules are not LoRA updates"
        )
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    out: dict[str, LoraFactors] = {}
    for key, a in tensors.items():
        if ".lora_A." not in key:
            continue
        module = key.split(".lora_A.")[0].removeprefix(_PREFIX)
        b = tensors[key.replace(".lora_A.", ".lora_B.")]
        alphas: dict[str, Any] = config.get("alpha_pattern") or {}
        alpha = float(alphas.get(get_pattern_key(list(alphas), module), config["lora_alpha"]))
        rank = a.shape[0]  # the weights' own rank (rank_pattern, if any, already shaped them)
        out[f"{module}.weight"] = LoraFactors(
            a.double(), b.double(), lora_scale(alpha, rank, bool(config.get("use_rslora")))
        )
    if not out:
        raise DriftError(f"{adapter_dir}: no lora_A/lora_B tensors in adapter_model.safetensors")
    return out


def base_weight_sq_norms(base_model: str, names: list[str]) -> dict[str, float]:
    """||W||_F^2 of the named base weights, read tensor by tensor from the model's safetensors."""
    from safetensors import safe_open

    path = Path(resolve_model(base_model))
    index = path / "model.safetensors.index.json"
    files = json.loads(index.read_text())["weight_map"] if index.exists() else None
    out: dict[str, float] = {}
    for name in names:
        file = path / (files[name] if files and name in files else "model.safetensors")
        with safe_open(str(file), framework="pt") as f:
            if name not in f.keys():
                raise DriftError(
                    f"base model {base_model}: no weight {name!r}; is this the adapter's base model?"
                )
            out[name] = float(f.get_tensor(name).double().pow(2).sum())
    return out


@dataclass(frozen=True)
class DriftRow:
    name: str
    weight_norm: float
    """||W||_F of the group's base weights."""
    update_norms: list[float]
    """||dW||_F per adapter."""
    relative: list[float]
    """||dW||_F / ||W||_F per adapter."""
    relative_diff: float | None
    """||dW_A - dW_B||_F / ||W||_F (two adapters only)."""
    cosine: float | None
    """<dW_A, dW_B> / (||dW_A|| ||dW_B||) (two adapters only; 0 when either is 0)."""


def group_key(module: str, group: Group) -> str:
    """The group a weight belongs to: itself, its transformer block, its projection kind, or all."""
    name = module.removesuffix(".weight")
    if group == "module":
        return name
    if group == "block":
        m = re.search(r"layers\.(\d+)\.", name)
        return f"layer {int(m.group(1)):>3}" if m else name
    if group == "kind":
        return name.split(".")[-1]
    return "total"


def drift_table(
    adapters: Sequence[str | Path], *, base_model: str | None = None, group: Group = "block"
) -> list[DriftRow]:
    """Rows of relative update norms, one per group (in model order), for one or two adapters."""
    if not 1 <= len(adapters) <= 2:
        raise DriftError(f"compare one or two adapters, got {len(adapters)}")
    factors = [read_lora(a) for a in adapters]
    base = base_model or adapter_base_model(adapters[0])
    names = sorted({n for f in factors for n in f}, key=_model_order)
    w2 = base_weight_sq_norms(base, names)
    acc: dict[str, list[float]] = {}  # group -> [||W||^2, ||dA||^2, ||dB||^2, <dA, dB>]
    for name in names:
        parts = [f.get(name) for f in factors]
        sq = [update_sq_norm(p) if p is not None else 0.0 for p in parts]
        cross = (
            update_inner(parts[0], parts[1])
            if len(parts) == 2 and parts[0] is not None and parts[1] is not None
            else 0.0
        )
        values = [w2[name], sq[0], sq[1] if len(sq) == 2 else 0.0, cross]
        row = acc.setdefault(group_key(name, group), [0.0, 0.0, 0.0, 0.0])
        for i, v in enumerate(values):
            row[i] += v
    return [_row(key, v, len(adapters)) for key, v in acc.items()]


def _row(name: str, v: list[float], n_adapters: int) -> DriftRow:
    w = math.sqrt(v[0])
    norms = [math.sqrt(max(x, 0.0)) for x in v[1 : 1 + n_adapters]]
    if n_adapters == 1:
        return DriftRow(name, w, norms, [x / w for x in norms], None, None)
    diff = math.sqrt(max(v[1] + v[2] - 2 * v[3], 0.0))
    cosine = v[3] / (norms[0] * norms[1]) if norms[0] > 0 and norms[1] > 0 else 0.0
    return DriftRow(name, w, norms, [x / w for x in norms], diff / w, cosine)


def _model_order(name: str) -> tuple:
    """Sort weights by block number, then name, so tables read top to bottom of the network."""
    m = re.search(r"layers\.(\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)
