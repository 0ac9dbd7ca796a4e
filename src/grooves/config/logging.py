"""The `[logging]` section: what a run writes into its folder, and how often."""

from __future__ import annotations

from pydantic import Field

from grooves.config.base import Section


class LoggingConfig(Section):
    samples_every: int = Field(1, ge=1)
    """Write all trajectories of every K-th step to samples/."""
    checkpoint_every: int = Field(1, ge=1)
    """Checkpoint every K steps; resume loses at most K-1 steps."""
    keep_checkpoints: int = Field(3, ge=1)
    """Checkpoints kept on disk; older ones are deleted as new ones are written."""
    progress: bool = True
    """Progress bars on the terminal; false for logs and CI."""
