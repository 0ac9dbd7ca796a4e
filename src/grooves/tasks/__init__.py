"""Tasks: scenarios plus an async rollout that returns a scored `Trajectory`.

A task is anything with `scenarios(split)` and `async rollout(model, scenario)`; the trainer needs
nothing else. Built-in tasks are looked up by name; your own by `package.module:object` (a Task
instance, or a class/factory called with the run's `task_options`). An environment named there
runs as an `EnvironmentTask` (`grooves.tasks.environment`).
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any, Protocol

from grooves.core.trajectory import Trajectory
from grooves.envs.base import Environment
from grooves.envs.registry import NOT_AN_ENV, EnvLoadError, as_environment
from grooves.envs.sqlite import EnvSpec
from grooves.rollouts.handle import ModelHandle
from grooves.usercode import UserCodeError, add_code_folder, describe_unusable, import_object


class Task(Protocol):
    name: str

    def scenarios(self, split: str) -> list[dict[str, Any]]:
        """Scenarios of a split: `train`, `validation`, or `test` where the task holds scenarios
        back from both for a final measurement. Each is a JSON-able dict."""
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


def add_task_folder(folder: str | Path) -> None:
    """Put `folder` first on the import path, so `task = "mytask:MyTask"` finds a `mytask.py` there.

    `grooves train` and `grooves sft` call it with the run file's folder: a task module beside the
    run file imports without PYTHONPATH, wherever the command runs from."""
    add_code_folder(folder)


class TaskLoadError(ValueError):
    """A `task` or its options that cannot be used. `option` says where the problem is: None for the
    task itself (not found, not importable), "" for its options as a whole, else one option's name."""

    def __init__(self, message: str, option: str | None = None):
        super().__init__(message)
        self.option = option


def load_task(spec: str, options: dict[str, Any] | None = None) -> Task:
    """Resolve a run file's `task` setting; raises `TaskLoadError` (one line) for a task that
    cannot be imported or built and for options its constructor does not take.

    An environment named where a task is expected (an `EnvSpec`, an `Environment`, or a function
    that returns one) runs as `EnvironmentTask(env)` with its defaults: the environment's own turn
    limit and success at a grade of 1.0 (`task = "env:module:object"` takes those as options)."""
    options = dict(options or {})
    factory = _builtin(spec)
    if factory is None:
        if ":" not in spec:
            raise TaskLoadError(
                f"task {spec!r} is not built in ({', '.join(BUILTIN_TASKS)}) nor a `module:object` path"
            )
        try:
            factory = import_object(spec, "task", _NOT_A_TASK)
        except UserCodeError as exc:
            raise TaskLoadError(str(exc)) from exc
        problem = _not_a_task(factory)
        if problem:  # refused before calling it
            raise TaskLoadError(f"task {spec!r} is {problem}, {_NOT_A_TASK}")
    instance = _as_instance(spec, factory)
    if instance is not None and options:
        raise TaskLoadError(
            f"task {spec!r} is an instance, which takes no options"
            + (
                f'; for the environment\'s options write task = "env:{spec}"'
                if instance is not factory
                else ""
            ),
            option="",
        )
    task = (
        instance
        if instance is not None
        else _as_instance(spec, _construct(spec, factory, options), made=True)
    )
    for needed in ("scenarios", "rollout"):
        if not hasattr(task, needed):
            raise TaskLoadError(
                f"task {spec!r} has no `{needed}`; a task needs scenarios(split) and async rollout(model, scenario)"
                f", or an environment ({NOT_AN_ENV})"
            )
    return task


def _as_instance(spec: str, obj: Any, *, made: bool = False) -> Any:
    """`obj` when it is a task instance, an environment wrapped as a task, else None (a factory);
    `made`: it came from calling the factory, so it is returned as it is whatever it is."""
    if hasattr(obj, "rollout") and not isinstance(obj, type):
        return obj
    try:
        env = as_environment(obj, spec)
    except EnvLoadError as exc:
        raise TaskLoadError(f"task {str(exc).removeprefix('environment ')}") from exc
    if env is not None:
        from grooves.tasks.environment import EnvironmentTask

        return EnvironmentTask(env)
    return obj if made else None


_NOT_A_TASK = (
    "not a task: name a Task instance, a class with scenarios(split) and async rollout(model, scenario), "
    "an environment, or a function of yours that returns one"
)


def _not_a_task(obj: Any) -> str | None:
    """What `obj` is, when it obviously cannot be (or make) a task; None when it may.

    A task is a Task instance, a class with `scenarios` and `rollout`, an environment (an
    `EnvSpec`, an `Environment`, or its class), or a factory: a Python function (or a callable
    object) that returns one. A function of Python's standard library (`os:system`), a function
    written in C, a class without those methods, or a plain value is none of them, and is refused
    before it is called with the run's options.

    >>> import os
    >>> _not_a_task(os.system)
    "system from Python's standard library (posix)"
    >>> _not_a_task({"scenarios": []})
    'a dict'
    """
    if hasattr(obj, "rollout") and not isinstance(obj, type):
        return None  # an instance: checked for `scenarios` after
    if isinstance(obj, EnvSpec) or (not isinstance(obj, type) and isinstance(obj, Environment)):
        return None
    problem = describe_unusable(obj)
    if problem is not None:
        return problem
    inner = obj
    while isinstance(inner, functools.partial):
        inner = inner.func
    if isinstance(inner, type):
        if all(hasattr(inner, m) for m in ("scenarios", "reset")):
            return None  # an environment class
        missing = [m for m in ("scenarios", "rollout") if not hasattr(inner, m)]
        return f"the class {inner.__name__}, which has no {' and no '.join(missing)}" if missing else None
    return None


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
    except EnvLoadError as exc:  # `env:NAME` naming no usable environment: its own one line
        raise TaskLoadError(f"task {spec!r}: {exc}") from exc
    except (TypeError, ValueError, KeyError, OSError) as exc:  # a bad option value, a missing data file
        where = "" if options else None
        raise TaskLoadError(
            f"task {spec!r} could not be built: {type(exc).__name__}: {exc}", option=where
        ) from exc
