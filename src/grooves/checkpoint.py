"""Moved to `grooves.train.checkpoint`; kept for compatibility."""

from grooves.train.checkpoint import (
    CHECKPOINT_PREFIX,
    FORMAT,
    MANIFEST,
    CheckpointError,
    TrainState,
    checkpoint_dir,
    checkpoint_problem,
    latest_checkpoint,
    load_checkpoint,
    rng_states,
    save_checkpoint,
    set_rng_states,
)

__all__ = [
    "CHECKPOINT_PREFIX",
    "CheckpointError",
    "FORMAT",
    "MANIFEST",
    "TrainState",
    "checkpoint_dir",
    "checkpoint_problem",
    "latest_checkpoint",
    "load_checkpoint",
    "rng_states",
    "save_checkpoint",
    "set_rng_states",
]
