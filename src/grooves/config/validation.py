"""The `[validation]` section: held-out scenarios scored before the first step and every K steps.

`grooves train` validates on its task, `grooves sft` on the task its run file names; both score
through `training.evaluate.evaluate`, which `grooves eval` runs too.
"""

from __future__ import annotations

from pydantic import Field

from grooves.config.base import Section


class ValidationConfig(Section):
    every: int = Field(10, ge=0)
    """Validate every K steps (0 = only before the first and after the last step; `grooves sft`'s
    default)."""
    scenarios: int = Field(32, ge=1)
    """Held-out scenarios scored per validation (the first of the task's validation split)."""
    samples: int = Field(1, ge=1)
    """Rollouts per held-out scenario; more gives a steadier success rate for the same scenarios."""
    temperature: float = Field(0.7, ge=0, le=2)
    """Sampling temperature of validation rollouts (training's is `rollout.temperature`)."""
    max_tokens: int | None = Field(None, ge=1)
    """Per-turn completion budget of validation rollouts; unset: `rollout.max_tokens` (64 in
    `grooves sft`, which has no `[rollout]`)."""
    at_start: bool = True
    """Score the starting model before the first step; false skips that when it is already scored
    (an `init_adapter` that its own run validated on the same scenarios and seeds)."""
    final: bool = True
    """Score the model after the last step; false skips that (a step `every` lands on is still
    scored) when `grooves eval` will score the result anyway, e.g. on more scenarios or paired with
    another stage (`--against`): on a small CPU it can take as long as the steps themselves."""
