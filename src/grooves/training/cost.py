"""The work a run will do, said in one line before it starts, and a heartbeat while it runs.

A run on a small CPU can take many minutes, and most of that is rollouts: the training steps'
and the validations'. `plan_line` counts them from the run's settings before any weights load
(episodes and sampled-token bounds per step, which steps validate and on how many episodes), so a
run whose validation would cost as much as its training is visible before it starts, with the
setting that changes it. The heartbeat itself is `rollouts.gather`'s: without progress bars
(`logging.progress = false`, or output that is not a terminal) a long batch of rollouts writes a
line every `HEARTBEAT_S` seconds.
"""

from __future__ import annotations

import math
from typing import Any

from grooves.config import RunConfig, SftConfig, ValidationConfig

HEARTBEAT_S = 60.0
"""Seconds between heartbeat lines of a batch of rollouts shown without a progress bar."""


def validates_at(v: ValidationConfig, step: int, steps: int) -> bool:
    """Whether step `step` (1-based) of `steps` ends with a validation.

    >>> v = ValidationConfig(every=2, final=False)
    >>> [k for k in range(1, 6) if validates_at(v, k, 5)]
    [2, 4]
    """
    return bool(v.every and step % v.every == 0) or (step == steps and v.final)


def turns_of(task: Any) -> int | None:
    """Model calls an episode of `task` may make, when it says (an environment task's turn limit)."""
    turns = getattr(task, "max_turns", None)
    env = getattr(task, "env", None)
    if turns is None and env is not None:
        turns = getattr(getattr(env, "limits", None), "max_turns", None)
    return turns if isinstance(turns, int) else None


def plan_line(config: RunConfig, task: Any, start: int = 0) -> str:
    """The run's work in one line: episodes and sampled-token bound per step, and the validations.

    `start` is the step a resumed run continues after (its validation before step 1 is not run).
    """
    r, v = config.rollout, config.validation
    episodes = r.groups_per_step * r.group_size
    turns = turns_of(task)
    bound = (
        f"up to {turns} model calls of at most {r.max_tokens} tokens each"
        if turns
        else f"at most {r.max_tokens} tokens a model call"
    )
    tokens = f": <= {episodes * turns * r.max_tokens:,} sampled tokens a step" if turns else ""
    refill = (
        f", and up to {r.max_refill_draws} more scenarios a step while groups tie"
        if r.refill_zero_variance
        else ""
    )
    steps = config.steps - start
    line = f"plan: {steps} steps of {r.groups_per_step} groups x {r.group_size} rollouts = {episodes} episodes a step ({bound}{tokens}){refill}"
    return line + "; " + _validations(v, len(task.scenarios("validation")), config.steps, start)


def _validations(v: ValidationConfig, available: int, steps: int, start: int) -> str:
    at = [k for k in range(start + 1, steps + 1) if validates_at(v, k, steps)]
    first = start == 0 and v.at_start
    if not (at or first) or not available:
        return "no validation"
    scenarios = min(v.scenarios, available)
    each = scenarios * v.samples
    where = ["before step 1"] if first else []
    if at:
        shown = [str(k) for k in at] if len(at) <= 6 else [*map(str, at[:5]), "...", str(at[-1])]
        where.append(f"after step{'s' if len(at) > 1 else ''} {', '.join(shown)}")
    skip = "; validation.final = false skips the last" if v.final and steps in at else ""
    return (
        f"validation: {scenarios} scenarios x {_n(v.samples, 'sample')} = {each} episodes {' and '.join(where)} "
        f"({each * (len(at) + first)} in all){skip}"
    )


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def sft_plan_line(
    config: SftConfig, chats: int, steps: int, validation_scenarios: int | None, start: int = 0
) -> str:
    """An SFT run's work: steps of chats, passes over the data, and its validations."""
    seen = (steps - start) * config.batch_size
    line = f"plan: {steps - start} steps of {config.batch_size} chats = {seen} chats ({seen / max(chats, 1):.1f} passes over {chats})"
    if not validation_scenarios:
        return line + "; no validation"
    v = config.validation
    at = ([0] if start == 0 and v.at_start else []) + [
        k for k in range(start + 1, steps + 1) if validates_at(v, k, steps)
    ]
    scenarios = min(v.scenarios, validation_scenarios)
    each = scenarios * v.samples
    return (
        line
        + f"; validation: {scenarios} scenarios x {_n(v.samples, 'sample')} = {each} episodes at {len(at)} points ({each * len(at)} in all)"
    )


def sft_steps(config: SftConfig, chats: int) -> int:
    """Optimizer steps of an SFT run: `steps`, else ceil(epochs x chats / batch_size)."""
    return config.steps or math.ceil(config.epochs * chats / config.batch_size)
