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
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from grooves.adapters.registry import BadAdapter, check_adapter_finite
from grooves.models import resolve_model

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


def adapter_base_model(adapter_dir: str | Path) -> str:
    """The base model an adapter was trained on, as peft recorded it in adapter_config.json."""
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
) -> ExportResult:
    """Write `out_dir/merged` (a Hugging Face model) and/or `out_dir/adapter` (peft) for one adapter.

    `out_dir` must be absent or empty unless `overwrite`; it is written atomically (module docstring).
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (merged or adapter):
        raise ExportError("nothing to export: both the merged model and the adapter were turned off")
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
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32).eval()
    peft_model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        diff = None
        if adapter:
            peft_model.save_pretrained(tmp / "adapter")
        if merged:
            ids = probe_ids(tokenizer)
            reference = _logits(peft_model, ids) if verify else None
            plain = peft_model.merge_and_unload().to(getattr(torch, dtype))
            plain.save_pretrained(tmp / "merged")
            tokenizer.save_pretrained(tmp / "merged")
            if reference is not None:
                reloaded = AutoModelForCausalLM.from_pretrained(tmp / "merged", dtype=torch.float32).eval()
                diff = float((_logits(reloaded, ids) - reference).abs().max())
        if diff is not None and dtype == "float32" and diff > FLOAT32_TOLERANCE:
            raise ExportError(
                f"merged model's logits differ from the adapter's by {diff:.3g} (> {FLOAT32_TOLERANCE}); nothing was exported"
            )
        result = ExportResult(
            str(adapter_dir),
            base,
            dtype,
            str(out_dir / "merged") if merged else None,
            str(out_dir / "adapter") if adapter else None,
            diff,
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
