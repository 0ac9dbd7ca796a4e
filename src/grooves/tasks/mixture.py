"""Several tasks in one run, interleaved by weight: `tasks = [{task = "capitals", weight = 0.7}, ...]`.

Training one adapter on several tasks at once keeps it from forgetting one while it learns
another. `TaskMixture` presents the members as one `Task`, so the trainer's loop does not change:

- each training group comes from a task drawn at random with probability weight / sum(weights)
  (seeded), and that task then gives its next scenario from its own stream; the trainer's
  `grooves.training.data.MixtureStream` draws them, resumably;
- validation interleaves the tasks' validation splits round-robin, so the first
  `validation.scenarios` of them are balanced across tasks, and every task is measured each time;
- each scenario carries its task's name under `mixture_task`; `task_metrics` turns that into
  `task/<name>/reward_mean`, `task/<name>/success_rate` and `task/<name>/groups` (and the same under
  `val/` for validation), so forgetting shows up per task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grooves.config import ConfigError, RunConfig
from grooves.core.trajectory import Trajectory, TrajectoryGroup
from grooves.rollouts.handle import ModelHandle
from grooves.tasks import Task, TaskLoadError, load_task

TASK_KEY = "mixture_task"
"""Scenario key naming the member task a scenario belongs to."""


@dataclass(frozen=True)
class WeightedTask:
    name: str
    """Name in metrics (`task/<name>/...`)."""
    task: Task
    weight: float


class TaskMixture:
    """A `Task` made of weighted member tasks (see the module docstring)."""

    name = "mixture"

    def __init__(self, members: Sequence[WeightedTask]):
        if not members:
            raise ValueError("a task mixture needs at least one task")
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ValueError(
                f"task names in a mixture must be unique, got {names}; give repeated tasks a `name`"
            )
        for m in members:
            if not m.weight > 0:
                raise ValueError(f"task {m.name!r}: weight must be > 0, got {m.weight}")
        self.members = list(members)
        self._by_name = {m.name: m for m in members}

    @property
    def probabilities(self) -> list[float]:
        total = sum(m.weight for m in self.members)
        return [m.weight / total for m in self.members]

    def _tagged(self, member: WeightedTask, split: str) -> list[dict[str, Any]]:
        return [{**s, TASK_KEY: member.name} for s in member.task.scenarios(split)]

    def scenarios(self, split: str) -> list[dict[str, Any]]:
        """Training: every member's scenarios; validation: the members' interleaved round-robin."""
        per_task = [self._tagged(m, split) for m in self.members]
        if split == "train":
            return [s for scenarios in per_task for s in scenarios]
        longest = max(len(s) for s in per_task)
        return [s[i] for i in range(longest) for s in per_task if i < len(s)]

    async def rollout(self, model: ModelHandle, scenario: dict[str, Any]) -> Trajectory:
        name = scenario.get(TASK_KEY)
        if name not in self._by_name:
            raise ValueError(
                f"scenario has {TASK_KEY}={name!r}, not one of this mixture's tasks {sorted(self._by_name)}"
            )
        inner = {k: v for k, v in scenario.items() if k != TASK_KEY}
        traj = await self._by_name[name].task.rollout(model, inner)
        traj.metadata["task"] = name
        return traj


def build_task(config: RunConfig) -> Task:
    """The run's task: its `tasks` mixture if set, else the single `task`.

    A task that cannot be imported or built, or an option it does not take, is a `ConfigError`
    naming the run-file field (`task`, `task_options.<name>`, `tasks.<i>.options.<name>`)."""
    if not config.tasks:
        return _load(config.task, config.task_options, "task", "task_options")
    members = [
        WeightedTask(
            e.name or e.task, _load(e.task, e.options, f"tasks.{i}.task", f"tasks.{i}.options"), e.weight
        )
        for i, e in enumerate(config.tasks)
    ]
    return TaskMixture(members)


def _load(spec: str, options: dict[str, Any], field: str, options_field: str) -> Task:
    try:
        return load_task(spec, options)
    except TaskLoadError as exc:
        where = (
            field if exc.option is None else f"{options_field}.{exc.option}" if exc.option else options_field
        )
        raise ConfigError(f"{where}: {str(exc).removeprefix('task ')}") from None


def task_metrics(groups: Sequence[TrajectoryGroup], prefix: str = "") -> dict[str, float]:
    """Per-task reward mean, success rate and group count; empty for a single-task run."""
    by_task: dict[str, list[TrajectoryGroup]] = {}
    for g in groups:
        name = g.scenario.get(TASK_KEY)
        if name is not None:
            by_task.setdefault(name, []).append(g)
    out: dict[str, float] = {}
    for name, members in sorted(by_task.items()):
        trajs = [t for g in members for t in g.ok]
        key = f"{prefix}task/{name}"
        out[f"{key}/groups"] = float(len(members))
        out[f"{key}/reward_mean"] = sum(t.reward for t in trajs) / len(trajs) if trajs else float("nan")
        out[f"{key}/success_rate"] = (
            sum(t.metrics.get("success", 0.0) for t in trajs) / len(trajs) if trajs else float("nan")
        )
    return out
