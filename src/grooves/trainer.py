"""Moved to `grooves.train.loop`; kept for compatibility."""

from grooves.train.loop import (
    MIN_SHARED_PREFIX,
    GroupScorer,
    NonFiniteStep,
    RunInterrupted,
    ScenarioStream,
    StepObserver,
    build_policy,
    micro_batches,
    optimize,
    run,
    seed_everything,
    to_sequences,
    train,
    validate,
)

__all__ = ["GroupScorer", "MIN_SHARED_PREFIX", "NonFiniteStep", "RunInterrupted", "ScenarioStream", "StepObserver", "build_policy", "micro_batches", "optimize", "run", "seed_everything", "to_sequences", "train", "validate"]
