"""The watch's seams: what a detector is, and the two optional functions a user may plug in.

A detector keeps its own history (a trailing window, a baseline) and, shown one `StepView`,
returns an `Observation`: the statistics it measured (logged every step as `watch/...`) and
the findings it raised. It never sees the optimizer or the policy, so it cannot steer training.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from grooves.core.trajectory import Trajectory
from grooves.watch.finding import Finding
from grooves.watch.view import StepView


@dataclass
class Observation:
    """What one detector measured at one step."""

    stats: dict[str, float] = field(default_factory=dict)
    """Named `watch/<detector>/<quantity>`; plotted by the report."""
    findings: list[Finding] = field(default_factory=list)


class Detector(Protocol):
    """A stateful check run once per step."""

    name: str

    def observe(self, view: StepView) -> Observation: ...


class EmbedFn(Protocol):
    """Texts to vectors, e.g. a sentence encoder or a reward model's frozen encoder: [n, d]."""

    def __call__(self, texts: Sequence[str]) -> np.ndarray: ...


class RescoreFn(Protocol):
    """The reward's own signature, `reward(trajectory, scenario) -> float`.

    The watch calls it with a trajectory and *another* group's scenario to see whether the score
    depends on the input at all.
    """

    def __call__(self, trajectory: Trajectory, scenario: dict[str, Any]) -> float: ...
