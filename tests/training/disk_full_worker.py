"""Checkpoints written onto small real file systems, run by tests/training/test_checkpoint.py.

    unshare -rm sh -c 'mount -t tmpfs -o size=8k tmpfs DIR1 && ... && python disk_full_worker.py MODEL_DIR DIR1 ...'

Each DIR is a tmpfs of its own size, mounted in a private mount namespace, so the disk really
fills: each writer of a checkpoint (safetensors, torch.save, Python's file writes) runs out of
space its own way. For each DIR it prints one JSON line: what `save_checkpoint` raised (the
message, and the type of the write error under it) or "ok", and what is left in the folder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def main(model_dir: str, folders: list[str]) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grooves.training.checkpoint import CheckpointError, TrainState, save_checkpoint

    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(r=2, target_modules=["q_proj"])
    )
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    for folder in folders:
        row = {"folder": folder, "error": None, "under": None}
        try:
            save_checkpoint(
                Path(folder), TrainState(1, 4), model, optimizer, torch.Generator().manual_seed(5), "", keep=3
            )
        except CheckpointError as exc:
            row["error"], row["under"] = str(exc), type(exc.__context__).__name__
        row["left"] = sorted(p.name for p in (Path(folder) / "checkpoints").iterdir())
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
