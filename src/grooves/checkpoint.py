"""Checkpoints: everything needed to continue a run as if it had never stopped.

A checkpoint is a folder `checkpoints/step_000012/` holding the adapter (peft format, loadable by
`grooves serve --adapter`), the optimizer state, every RNG state, the data position and the
resolved config. It is written to a temporary folder and renamed into place, so a run killed
mid-write leaves the previous checkpoint intact, never a half-written one.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

CHECKPOINT_PREFIX = "step_"


@dataclass
class TrainState:
    step: int
    """Number of optimizer steps completed."""
    data_position: int
    """How many training scenarios have been consumed (across epochs)."""


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"{CHECKPOINT_PREFIX}{step:06d}"


def save_checkpoint(run_dir: Path, state: TrainState, model, optimizer, policy_generator, config_toml: str, keep: int) -> Path:
    final = checkpoint_dir(run_dir, state.step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp / "adapter")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(
        {
            "torch": torch.get_rng_state(),
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "policy": policy_generator.get_state(),
        },
        tmp / "rng.pt",
    )
    (tmp / "state.json").write_text(json.dumps({"step": state.step, "data_position": state.data_position}))
    (tmp / "config.toml").write_text(config_toml)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    _prune(run_dir / "checkpoints", keep)
    return final


def _prune(folder: Path, keep: int) -> None:
    done = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) and not p.name.endswith(".tmp"))
    for old in done[:-keep]:
        shutil.rmtree(old)


def latest_checkpoint(run_dir: Path) -> Path | None:
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return None
    done = sorted(
        p for p in folder.iterdir() if p.name.startswith(CHECKPOINT_PREFIX) and (p / "state.json").exists() and not p.name.endswith(".tmp")
    )
    return done[-1] if done else None


def load_checkpoint(path: Path, model, optimizer, policy_generator) -> TrainState:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    adapter = load_file(str(path / "adapter" / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, adapter)
    if getattr(result, "unexpected_keys", None):
        raise RuntimeError(f"{path}: adapter does not match this model (unexpected keys {result.unexpected_keys[:3]})")
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    rng = torch.load(path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    policy_generator.set_state(rng["policy"])
    info = json.loads((path / "state.json").read_text())
    return TrainState(step=info["step"], data_position=info["data_position"])
