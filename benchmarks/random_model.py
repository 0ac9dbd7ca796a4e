"""A model directory with random weights in a known architecture, for speed runs without trained weights.

A GPU machine that cannot reach a model hub may hold no weights at all, but the time a GRPO step
takes depends on the architecture and the token counts, not on what the weights say. This writes
`config.json`, random `model.safetensors` and a tokenizer (SmolLM2-135M-Instruct's, from
`benchmarks/gpu_bundle.sh`) so both frameworks in `bench_grpo_step.py` load the same model.
Random weights almost never sample the end-of-turn token, so every completion runs to
`max_tokens`: a fixed amount of decode work on both sides.

    python benchmarks/random_model.py --shape qwen2.5-1.5b --tokenizer .gpu/tokenizer --out /tmp/random-qwen2.5-1.5b
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

SHAPES: dict[str, dict | None] = {
    # the tokenizer folder's own config.json (SmolLM2-135M: 30 layers, width 576)
    "smollm2-135m": None,
    # Qwen2.5-1.5B-Instruct's published architecture; the vocabulary is the tokenizer's
    "qwen2.5-1.5b": {
        "model_type": "qwen2",
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
    },
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
)


def build(
    shape: str,
    tokenizer_dir: str | Path,
    out: str | Path,
    *,
    dtype: str = "bfloat16",
    device: str = "cpu",
    num_layers: int | None = None,
    seed: int = 0,
) -> Path:
    """Write a randomly initialized `shape` model with the tokenizer of `tokenizer_dir` to `out`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if shape not in SHAPES:
        raise SystemExit(f"--shape {shape!r} is not one of {sorted(SHAPES)}")
    tokenizer_dir, out = Path(tokenizer_dir), Path(out)
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise SystemExit(
            f"{tokenizer_dir}: no tokenizer.json; run benchmarks/gpu_bundle.sh first (it writes .gpu/tokenizer)"
        )
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    overrides = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if num_layers is not None:
        overrides["num_hidden_layers"] = num_layers
    if SHAPES[shape] is None:
        config = AutoConfig.from_pretrained(tokenizer_dir, **overrides)
    else:
        fields = dict(SHAPES[shape])
        config = AutoConfig.for_model(fields.pop("model_type"), **{**fields, **overrides})
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file() and name != "generation_config.json":
            shutil.copy(tokenizer_dir / name, out / name)
    params = sum(p.numel() for p in model.parameters())
    (out / "random_weights.json").write_text(
        json.dumps({"shape": shape, "parameters": params, "seed": seed}) + "\n"
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    ap.add_argument("--tokenizer", default=".gpu/tokenizer")
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cpu", help="where to initialize (cuda is faster for the 1.5B shape)")
    ap.add_argument("--num-layers", type=int, default=None, help="fewer layers than the shape has (tests)")
    args = ap.parse_args()
    out = build(
        args.shape, args.tokenizer, args.out, dtype=args.dtype, device=args.device, num_layers=args.num_layers
    )
    print(out)


if __name__ == "__main__":
    main()
