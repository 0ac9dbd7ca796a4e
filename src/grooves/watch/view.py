"""One step as the detectors see it: metrics, groups, and the texts pulled out of them once.

Every detector reads the same `StepView`, so the input text of a scenario is extracted one way
for all of them (and for the inspection page), and a failed rollout is skipped the same way
everywhere: it has no output to judge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from grooves.core.trajectory import Trajectory, TrajectoryGroup
from grooves.watch.stats import finite


@dataclass(frozen=True)
class StepView:
    """A step's metrics and its groups, with each group's input text and ok outputs."""

    step: int
    metrics: Mapping[str, Any]
    groups: Sequence[TrajectoryGroup] = ()
    inputs: list[str] = field(default_factory=list)
    """inputs[g]: the text of group g's scenario."""
    outputs: list[list[str]] = field(default_factory=list)
    """outputs[g]: completions of group g's successful trajectories."""
    trajectories: list[list[Trajectory]] = field(default_factory=list)
    """trajectories[g]: those successful trajectories, aligned with outputs[g]."""

    @classmethod
    def build(
        cls,
        step: int,
        metrics: Mapping[str, Any],
        groups: Sequence[TrajectoryGroup],
        input_keys: Sequence[str] | None = None,
    ) -> StepView:
        kept = [g for g in groups if g.ok]
        return cls(
            step=step,
            metrics=metrics,
            groups=kept,
            inputs=[scenario_text(g, input_keys) for g in kept],
            outputs=[[t.completion for t in g.ok] for g in kept],
            trajectories=[list(g.ok) for g in kept],
        )

    def metric(self, key: str) -> float | None:
        """A finite metric value or None."""
        return finite(self.metrics.get(key))

    def reward_mean(self, key: str) -> float | None:
        """The metric `key`, else the mean reward of the step's successful trajectories."""
        value = self.metric(key)
        if value is None:
            rewards = [t.reward for ts in self.trajectories for t in ts]
            value = float(np.mean(rewards)) if rewards else None
        return value

    def reward_std(self, mean_key: str) -> float | None:
        """The std matching a `..._mean` key (reward_mean -> reward_std), else from the trajectories."""
        std_key = mean_key[: -len("_mean")] + "_std" if mean_key.endswith("_mean") else None
        value = self.metric(std_key) if std_key else None
        if value is None and mean_key in ("reward_mean", "reward"):
            rewards = [t.reward for ts in self.trajectories for t in ts]
            value = float(np.std(rewards)) if len(rewards) > 1 else None
        return value

    def completion_length(self, key: str) -> float | None:
        """The metric `key`, else the mean sampled tokens (words, for text-only trajectories)."""
        value = self.metric(key)
        if value is None:
            lengths = [
                t.num_sampled_tokens or len(t.completion.split()) for ts in self.trajectories for t in ts
            ]
            value = float(np.mean(lengths)) if lengths else None
        return value


def scenario_text(group: TrajectoryGroup, input_keys: Sequence[str] | None = None) -> str:
    """The input of a group as text.

    With `input_keys`, those scenario fields joined by newlines (a missing one is a config error).
    Without, every string found in the scenario; a scenario with no strings falls back to the
    user messages of the group's first trajectory.
    """
    scenario = group.scenario
    if input_keys:
        missing = [k for k in input_keys if k not in scenario]
        if missing:
            raise ValueError(
                f"watch.input_keys names {missing} but a scenario has keys {sorted(scenario)}; "
                "set watch.input_keys to fields every scenario has"
            )
        return "\n".join(_strings(scenario[k]) for k in input_keys)
    text = _strings(scenario)
    if text or not group.trajectories:
        return text
    messages = group.trajectories[0].messages
    return "\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "user")


def _strings(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        parts = [_strings(v) for v in value.values()]
    elif isinstance(value, list | tuple):
        parts = [_strings(v) for v in value]
    else:
        return ""  # ids and scores are not text an output could meaningfully mention
    return "\n".join(p for p in parts if p)
