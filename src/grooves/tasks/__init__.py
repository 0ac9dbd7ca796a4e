"""Tasks: scenarios plus an async rollout that returns a scored `Trajectory`.

A task is anything with `scenarios(split)` and `async rollout(model, scenario)`; the trainer needs
nothing else. Built-in tasks are looked up by name; your own by `package.module:object` (a Task
instance, or a class/factory called with the run's `task_options`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Protocol

from grooves.core.handle import ModelHandle
from grooves.core.trajectory import Trajectory


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
    if name.startswith("env:"):
        from grooves.tasks.environment import EnvironmentTask

        return functools.partial(EnvironmentTask, name[4:])
    return None


BUILTIN_TASKS = ("capitals", "toy_tokens", "env:<environment>")


class TaskLoadError(ValueError):
    """A `task` or its options that cannot be used. `option` says where the problem is: None for the
    task itself (not found, not importable), "" for its options as a whole, else one option's name."""

    def __init__(self, message: str, option: str | None = None):
        super().__init__(message)
        self.option = option


def load_task(spec: str, options: dict[str, Any] | None = None) -> Task:
    """Resolve a run file's `task` setting; raises `TaskLoadError` (one line) for a task that
    cannot be imported or built and for options its constructor does not take."""
    options = dict(options or {})
    factory = _builtin(spec)
    if factory is None:
        if ":" not in spec:
            raise TaskLoadError(
                f"task {spec!r} is not built in ({', '.join(BUILTIN_TASKS)}) nor a `module:object` path"
            )
        module_name, _, attr = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise TaskLoadError(f"task {spec!r}: cannot import {module_name}: {exc}") from exc
        except Exception as exc:  # the module's own code failed while importing; say how, on one line
            raise TaskLoadError(
                f"task {spec!r}: importing {module_name} raised {type(exc).__name__}: {exc}"
            ) from exc
        if not hasattr(module, attr):
            raise TaskLoadError(
                f"task {spec!r}: cannot import: module {module_name} has no attribute {attr!r}"
            )
        factory = getattr(module, attr)
    is_instance = hasattr(factory, "rollout") and not isinstance(factory, type)
    if is_instance and options:
        raise TaskLoadError(f"task {spec!r} is an instance, which takes no options", option="")
    task = factory if is_instance else _construct(spec, factory, options)
    for needed in ("scenarios", "rollout"):
        if not hasattr(task, needed):
            raise TaskLoadError(
                f"task {spec!r} has no `{needed}`; a task needs scenarios(split) and async rollout(model, scenario)"
            )
    return task


def _construct(spec: str, factory, options: dict[str, Any]) -> Task:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a C callable): let the call decide
        params = None
    if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params):
        known = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        for key in options:
            if key not in known:
                takes = ", ".join(known) if known else "none"
                raise TaskLoadError(f"task {spec!r} has no option {key!r}; its options: {takes}", option=key)
    try:
        return factory(**options)
    except (TypeError, ValueError, KeyError, OSError) as exc:  # a bad option value, a missing data file
        where = "" if options else None
        raise TaskLoadError(
            f"task {spec!r} could not be built: {type(exc).__name__}: {exc}", option=where
        ) from exc
