"""Moved to `grooves.core.tokenize`; kept for compatibility."""

from grooves.core.tokenize import (
    TrainBatch,
    TrainSequence,
    block_causal_mask,
    check_mask_shape,
    logprob_temperature,
    pack_batches,
    pad_batch,
    prefix_breaks,
    trajectory_to_sequences,
)

__all__ = [
    "TrainBatch",
    "TrainSequence",
    "block_causal_mask",
    "check_mask_shape",
    "logprob_temperature",
    "pack_batches",
    "pad_batch",
    "prefix_breaks",
    "trajectory_to_sequences",
]
