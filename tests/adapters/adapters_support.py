"""Shared by the adapter tests: real peft adapters and run folders built on the tiny model."""

from __future__ import annotations

import json
import shutil

import torch


def make_adapter(model_dir, out, *, seed=0, rank=2, alpha=4.0, targets=("q_proj", "v_proj"), **extra):
    """A saved peft LoRA adapter with random (non-zero) A and B, so it changes the model's outputs."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False, **extra
    )
    get_peft_model(model, config).save_pretrained(out)
    return out


def make_run(run_dir, val_by_step: dict[int, float | None], *, model_dir):
    """A run folder as the trainer writes it: one real adapter checkpoint per step, metrics rows."""
    template = make_adapter(model_dir, run_dir.parent / f"{run_dir.name}-template")
    rows = []
    for step, val in val_by_step.items():
        ckpt = run_dir / "checkpoints" / f"step_{step:06d}"
        shutil.copytree(template, ckpt / "adapter")
        (ckpt / "state.json").write_text(json.dumps({"step": step, "data_position": step * 4}))
        row = {"step": step, "reward_mean": 0.1 * step}
        if val is not None:
            row["val/success_rate"] = val
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def poison_adapter(adapter_dir, value=float("nan")):
    """Set one weight of a saved adapter to `value` (NaN by default), as a diverged run leaves it; returns its name."""
    from safetensors.torch import load_file, save_file

    path = adapter_dir / "adapter_model.safetensors"
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    tensors[name][0, 0] = value
    save_file(tensors, str(path))
    return name
