"""`grooves export`: an adapter as a plain Hugging Face model (merged) and as a peft adapter.

Merging folds each LoRA update into its base weight, W' = W + (alpha / r) B A (peft's
`merge_and_unload`), so the exported model is an ordinary checkpoint with no adapter code at
inference time: transformers, vLLM and llama.cpp converters load it like any other, and it runs at
the base model's speed. The merge is done in float32 whatever the export dtype, so only the final
cast rounds.

The export checks itself: it reloads the written model with plain transformers and compares its
logits on a probe chat with the adapter model's logits before the merge; the maximum absolute
difference is written to `export.json` next to the model (about 1e-6 in float32: a merge changes
the order of floating-point sums, nothing else).

With `gguf_type` set (`grooves export --format gguf`), the merged model is also written as one
GGUF file, `model.gguf` (`to_gguf.py`: llama.cpp's tensor names and tokenizer metadata), for
llama.cpp and the runtimes built on it; the export loads it back with transformers' GGUF loader
and records its logits' difference from the merged model's (0 for `f32`).

The output folder appears whole or not at all: everything is written into a temporary folder
beside it (`.NAME.*.tmp`) and renamed into place once verified, so an export that fails or is
killed leaves no half-written model where a server would load it. An existing non-empty output
folder is refused unless `overwrite` is given; then the old folder is moved aside, the new one
renamed in, and the old one deleted. An adapter whose weights hold NaN or inf is refused before
anything is written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import cast

import torch

from grooves.adapters.registry import BadAdapter, check_adapter_finite
from grooves.adapters.to_gguf import GGUF_TYPES, GgufError, GgufType, write_gguf
from grooves.models import adapter_base, check_adapter_base, describe_base, record_adapter_base, resolve_model
from grooves.policy.loaded_adapters import peft_wrapping

PROBE_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of France?"},
]
FLOAT32_TOLERANCE = 1e-3
"""A float32 export whose logits differ by more than this from the adapter's is reported as broken."""


class ExportError(RuntimeError):
    """An export that cannot be written or does not reproduce its adapter."""


@dataclass(frozen=True)
class ExportResult:
    adapter_source: str
    base_model: str
    dtype: str
    merged_dir: str | None
    adapter_dir: str | None
    max_abs_logit_diff: float | None
    """Reloaded merged model vs adapter model, on the probe chat (None when not verified)."""
    base: dict | None = None
    """The base model merged into (`models.BaseModelRecord`: Hub id, local path, weights sha256)."""
    base_warning: str | None = None
    """Set when the adapter records another base (its weights hash differs from this one's)."""
    gguf: dict | None = None
    """The GGUF file (`to_gguf.GgufInfo`: path, type, tensors, pre-tokenizer, bytes), if written."""
    gguf_max_abs_logit_diff: float | None = None
    """GGUF model (loaded back by transformers) vs the merged model, on the probe chat."""


def adapter_base_model(adapter_dir: str | Path) -> str:
    """The base model an adapter was trained on: the local path its `base_model.json` records when
    that folder is on this machine, else its Hub id, else what peft wrote in adapter_config.json."""
    record = adapter_base(adapter_dir)
    if record is not None:
        if record.path and Path(record.path).is_dir():
            return record.path
        if record.hub_id:
            return record.hub_id
    config_path = Path(adapter_dir) / "adapter_config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ExportError(f"{adapter_dir}: no adapter_config.json; pass a peft adapter folder") from None
    base = config.get("base_model_name_or_path")
    if not base:
        raise ExportError(f"{config_path}: no base_model_name_or_path; pass the base model with --base")
    return str(base)


def probe_ids(tokenizer) -> torch.Tensor:
    """Token ids of the probe chat, [1, P]."""
    text = tokenizer.apply_chat_template(PROBE_MESSAGES, tokenize=False, add_generation_prompt=True)
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])


@torch.no_grad()
def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids).logits.float()  # [1, P, V]


def export_adapter(
    adapter_dir: str | Path,
    out_dir: str | Path,
    *,
    base_model: str | None = None,
    dtype: str = "float32",
    merged: bool = True,
    adapter: bool = True,
    verify: bool = True,
    overwrite: bool = False,
    gguf_type: str | None = None,
) -> ExportResult:
    """Write `out_dir/merged` (a Hugging Face model) and/or `out_dir/adapter` (peft) for one adapter,
    and with `gguf_type` (f32, f16, bf16, q8_0) `out_dir/model.gguf`.

    `out_dir` must be absent or empty unless `overwrite`; it is written atomically (module docstring).
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (merged or adapter or gguf_type):
        raise ExportError("nothing to export: both the merged model and the adapter were turned off")
    if gguf_type is not None and gguf_type not in GGUF_TYPES:
        raise ExportError(f"gguf type {gguf_type!r}: use one of {', '.join(GGUF_TYPES)}")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ExportError(f"dtype={dtype!r}: use float32, bfloat16 or float16")
    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    if out_dir.exists() and not overwrite and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ExportError(
            f"--out {out_dir} is not empty; pass --overwrite to replace it, or choose another folder"
        )
    base = base_model or adapter_base_model(adapter_dir)
    try:
        check_adapter_finite(adapter_dir)
    except BadAdapter as exc:
        raise ExportError(f"{exc}; nothing was exported") from None
    base_path = resolve_model(base)
    base_record = describe_base(base_path)
    recorded = adapter_base(adapter_dir)
    if (
        recorded
        and recorded.hub_id
        and not base_record.hub_id
        and recorded.weights_sha256 == base_record.weights_sha256
    ):
        base_record = replace(
            base_record, hub_id=recorded.hub_id
        )  # the same weights: the Hub id it was trained under
    base_warning = check_adapter_base(adapter_dir, base_path)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32).eval()
    with peft_wrapping():
        peft_model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        diff = None
        if adapter:
            peft_model.save_pretrained(str(tmp / "adapter"))
            record_adapter_base(tmp / "adapter", base_record)
        gguf_info, gguf_diff = None, None
        if merged or gguf_type:
            ids = probe_ids(tokenizer)
            reference = _logits(peft_model, ids) if verify else None
            plain = peft_model.merge_and_unload().to(getattr(torch, dtype))
            plain.save_pretrained(tmp / "merged")
            tokenizer.save_pretrained(tmp / "merged")
            reloaded = None
            if reference is not None:
                reloaded = AutoModelForCausalLM.from_pretrained(tmp / "merged", dtype=torch.float32).eval()
                diff = float((_logits(reloaded, ids) - reference).abs().max())
            if gguf_type:
                try:
                    kind = cast(GgufType, gguf_type)  # one of GGUF_TYPES (checked above)
                    gguf_info = asdict(write_gguf(tmp / "merged", tmp / "model.gguf", gguf_type=kind))
                except GgufError as exc:
                    raise ExportError(f"{exc}; nothing was exported") from None
                gguf_info["path"] = str(out_dir / "model.gguf")
                if reloaded is not None:
                    from_gguf = AutoModelForCausalLM.from_pretrained(
                        tmp, gguf_file="model.gguf", dtype=torch.float32
                    ).eval()
                    gguf_diff = float((_logits(from_gguf, ids) - _logits(reloaded, ids)).abs().max())
            if not merged:  # written only to make the GGUF from
                shutil.rmtree(tmp / "merged")
        if diff is not None and dtype == "float32" and diff > FLOAT32_TOLERANCE:
            raise ExportError(
                f"merged model's logits differ from the adapter's by {diff:.3g} (> {FLOAT32_TOLERANCE}); nothing was exported"
            )
        if gguf_diff is not None and gguf_type == "f32" and gguf_diff > FLOAT32_TOLERANCE:
            raise ExportError(
                f"the f32 GGUF's logits differ from the merged model's by {gguf_diff:.3g} (> {FLOAT32_TOLERANCE}); nothing was exported"
            )
        result = ExportResult(
            str(adapter_dir),
            base,
            dtype,
            str(out_dir / "merged") if merged else None,
            str(out_dir / "adapter") if adapter else None,
            diff,
            base_record.to_json(),
            base_warning,
            gguf_info,
            gguf_diff,
        )
        (tmp / "export.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
        _move_into_place(tmp, out_dir)
    except BaseException:  # a failed or interrupted export leaves nothing behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def _move_into_place(tmp: Path, out_dir: Path) -> None:
    """Rename `tmp` to `out_dir`; an existing `out_dir` is moved aside first and deleted after."""
    if out_dir.is_dir() and not any(out_dir.iterdir()):
        out_dir.rmdir()
    if not out_dir.exists() and not out_dir.is_symlink():
        os.rename(tmp, out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old", dir=out_dir.parent))
    aside = old / "previous"
    os.rename(out_dir, aside)
    os.rename(tmp, out_dir)
    shutil.rmtree(old)
