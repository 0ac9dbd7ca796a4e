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
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

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
) -> ExportResult:
    """Write `out_dir/merged` (a Hugging Face model) and/or `out_dir/adapter` (peft) for one adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (merged or adapter):
        raise ExportError("nothing to export: both the merged model and the adapter were turned off")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ExportError(f"dtype={dtype!r}: use float32, bfloat16 or float16")
    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    base = base_model or adapter_base_model(adapter_dir)
    base_path = resolve_model(base)
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32).eval()
    peft_model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    adapter_out = merged_out = None
    if adapter:
        adapter_out = out_dir / "adapter"
        peft_model.save_pretrained(adapter_out)
    diff = None
    if merged:
        ids = probe_ids(tokenizer)
        reference = _logits(peft_model, ids) if verify else None
        plain = peft_model.merge_and_unload().to(getattr(torch, dtype))
        merged_out = out_dir / "merged"
        plain.save_pretrained(merged_out)
        tokenizer.save_pretrained(merged_out)
        if reference is not None:
            reloaded = AutoModelForCausalLM.from_pretrained(merged_out, dtype=torch.float32).eval()
            diff = float((_logits(reloaded, ids) - reference).abs().max())
    result = ExportResult(
        str(adapter_dir), base, dtype, str(merged_out) if merged_out else None, str(adapter_out) if adapter_out else None, diff
    )
    (out_dir / "export.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    if diff is not None and dtype == "float32" and diff > FLOAT32_TOLERANCE:
        raise ExportError(f"merged model's logits differ from the adapter's by {diff:.3g} (> {FLOAT32_TOLERANCE}); see {out_dir}")
    return result
