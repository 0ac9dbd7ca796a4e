"""Tasks: scenarios plus an async rollout that returns a scored `Trajectory`.

A task is anything with `scenarios(split)` and `async rollout(model, scenario)`; the trainer needs
nothing else. Built-in tasks are looked up by name; your own by `package.module:object` (a Task
instance, or a class/factory called with the run's `task_options`).
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

from grooves.policy.handle import ModelHandle
from grooves.trajectory import Trajectory


class Task(Protocol):
    name: str

    def scenarios(self, split: str) -> list[dict[str, Any]]:
        """Scenarios of a split: `train` or `validation`. Each is a JSON-able dict."""
        ...

    async def rollout(self, model: ModelHandle, scenario: dict[str, Any]) -> Trajectory:
        """Run the agent once on `scenario` and return the trajectory with its reward set."""
        ...


def _builtin(name: str):
    if name == "capitals":
        from grooves.tasks.capitals import CapitalsTask

        return CapitalsTask
    if name == "toy_tokens":
        from grooves.tasks.toy import ToyTokensTask

        return ToyTokensTask
    if name == "hn_titles":
        from grooves.tasks.hn_titles import HNTitlesTask

        return HNTitlesTask
    if name.startswith("env:"):
        from grooves.tasks.environment import EnvironmentTask

        return lambda **options: EnvironmentTask(name[4:], **options)
    return None


BUILTIN_TASKS = ("capitals", "toy_tokens", "hn_titles", "env:<environment>")


def load_task(spec: str, options: dict[str, Any] | None = None) -> Task:
    """Resolve a run file's `task` setting."""
    options = dict(options or {})
    factory = _builtin(spec)
    if factory is None:
        if ":" not in spec:
            raise ValueError(f"task {spec!r} is not built in ({', '.join(BUILTIN_TASKS)}) nor a `module:object` path")
        module_name, _, attr = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"task {spec!r}: cannot import: {exc}") from exc
    is_instance = hasattr(factory, "rollout") and not isinstance(factory, type)
    task = factory if is_instance else factory(**options)
    for needed in ("scenarios", "rollout"):
        if not hasattr(task, needed):
            raise ValueError(f"task {spec!r} has no `{needed}`; a task needs scenarios(split) and async rollout(model, scenario)")
    return task
