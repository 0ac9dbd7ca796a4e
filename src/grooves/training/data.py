"""Where a run's training examples come from, in a resumable seeded order.

`ScenarioStream` hands out a task's training scenarios (or SFT's chats) in a fresh shuffled order
each epoch; `MixtureStream` draws the task of each group of a `TaskMixture` by weight and takes
that task's next scenario. Either one's `position` is the checkpoint's `data_position`: setting it
puts the stream exactly where the checkpointed run was.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from grooves.tasks import Task
from grooves.tasks.mixture import TASK_KEY, TaskMixture


class ScenarioStream:
    """Training scenarios in a fresh seeded order each epoch; `position` makes it resumable."""

    def __init__(self, scenarios: Sequence[Any], seed: int, position: int = 0):
        if not scenarios:
            raise ValueError("the task has no training scenarios")
        self.scenarios = list(scenarios)
        self.seed = seed
        self.position = position

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.scenarios)))
        random.Random(self.seed * 7919 + epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[tuple[int, Any]]:
        out = []
        for _ in range(k):
            epoch, i = divmod(self.position, len(self.scenarios))
            index = self._order(epoch)[i]
            out.append((index, self.scenarios[index]))
            self.position += 1
        return out


class MixtureStream:
    """Training scenarios of a mixture: a seeded task draw per group, then that task's next scenario.

    Same interface as `ScenarioStream` (`take(k)`, a settable `position`), so the trainer and its
    checkpoints handle both alike. The whole state is one integer, the number of draws so far: the
    draws are a seeded sequence and each task's position is how often it was drawn, so setting
    `position = n` (a checkpoint's `data_position`) replays n draws and restores it exactly.
    """

    def __init__(self, mixture: TaskMixture, seed: int, position: int = 0):
        self.mixture = mixture
        self.seed = seed
        self._streams = [ScenarioStream(m.task.scenarios("train"), seed) for m in mixture.members]
        self.position = position

    @property
    def position(self) -> int:
        """Number of groups drawn so far; setting it replays that many draws."""
        return self._draws

    @position.setter
    def position(self, value: int) -> None:
        self._rng = random.Random(f"grooves-mixture/{self.seed}")
        self._draws = 0
        for s in self._streams:
            s.position = 0
        counts = [0] * len(self._streams)
        for i in self._draw(value):
            counts[i] += 1
        for s, n in zip(self._streams, counts, strict=True):
            s.position = n

    def _draw(self, k: int) -> list[int]:
        picks = self._rng.choices(range(len(self._streams)), weights=self.mixture.probabilities, k=k)
        self._draws += k
        return picks

    def take(self, k: int) -> list[tuple[int, dict[str, Any]]]:
        out = []
        for i in self._draw(k):
            member = self.mixture.members[i]
            ((index, scenario),) = self._streams[i].take(1)
            out.append((index, {**scenario, TASK_KEY: member.name}))
        return out


def train_stream(task: Task, seed: int) -> ScenarioStream | MixtureStream:
    """The training-scenario stream of a task: a `MixtureStream` for a mixture, else a `ScenarioStream`."""
    if isinstance(task, TaskMixture):
        return MixtureStream(task, seed)
    return ScenarioStream(task.scenarios("train"), seed)
