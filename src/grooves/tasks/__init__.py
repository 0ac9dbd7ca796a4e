"""Tasks: scenarios plus an async rollout that returns a scored `Trajectory`.

A task is anything with `scenarios(split)` and `async rollout(model, scenario)`; the trainer needs
nothing else. Built-in tasks are looked up by name; your own by `package.module:object` (a Task
instance, or a class/factory called with the run's `task_options`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import types
from pathlib import Path
from typing import Any, Protocol

from grooves.core.trajectory import Trajectory
from grooves.rollouts.handle import ModelHandle


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
    if name.startswith("verifiers:"):
        from grooves.tasks.verifiers import VerifiersTask

        return functools.partial(VerifiersTask, name[len("verifiers:") :])
    return None


BUILTIN_TASKS = ("capitals", "toy_tokens", "env:<environment>", "verifiers:<taskset>")

_TASK_FOLDER: list[str] = []
"""The folder `add_task_folder` last put on the import path (the run file's), named when an import fails."""


def add_task_folder(folder: str | Path) -> None:
    """Put `folder` first on the import path, so `task = "mytask:MyTask"` finds a `mytask.py` there.

    `grooves train` and `grooves sft` call it with the run file's folder: a task module beside the
    run file imports without PYTHONPATH, wherever the command runs from."""
    path = str(Path(folder).resolve())
    if path not in sys.path:
        sys.path.insert(0, path)
    _TASK_FOLDER[:] = [path]


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
        if _is_stdlib(module_name):  # refused before importing anything
            raise TaskLoadError(f"task {spec!r}: {module_name} is Python's standard library, {_NOT_A_TASK}")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            folders = [f for f in _TASK_FOLDER if f in sys.path]
            looked = f"the run file's folder ({folders[0]}), " if folders else ""
            raise TaskLoadError(
                f"task {spec!r}: cannot import {module_name}: {exc}; Python looked in {looked}the running "
                "script's folder, PYTHONPATH and the installed packages: put the module beside the run file, "
                "add its folder to PYTHONPATH, or pip install its package"
            ) from exc
        except Exception as exc:  # the module's own code failed while importing; say how, on one line
            raise TaskLoadError(
                f"task {spec!r}: importing {module_name} raised {type(exc).__name__}: {exc}"
            ) from exc
        if not hasattr(module, attr):
            raise TaskLoadError(
                f"task {spec!r}: cannot import: module {module_name} has no attribute {attr!r}"
            )
        factory = getattr(module, attr)
        problem = _not_a_task(factory)
        if problem:  # refused before calling it
            raise TaskLoadError(f"task {spec!r} is {problem}, {_NOT_A_TASK}")
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


_NOT_A_TASK = (
    "not a task: name a Task instance, a class with scenarios(split) and async rollout(model, scenario), "
    "or a function of yours that returns one"
)


def _is_stdlib(module_name: str | None) -> bool:
    return bool(module_name) and module_name.partition(".")[0] in sys.stdlib_module_names  # type: ignore[union-attr]


def _not_a_task(obj: Any) -> str | None:
    """What `obj` is, when it obviously cannot be (or make) a task; None when it may.

    A task is a Task instance, a class with `scenarios` and `rollout`, or a factory: a Python
    function (or a callable object) that returns one. A function of Python's standard library
    (`os:system`), a function written in C, a class without the two methods, or a plain value is
    none of them, and is refused before it is called with the run's options.

    >>> import os
    >>> _not_a_task(os.system)
    "system from Python's standard library (posix)"
    >>> _not_a_task({"scenarios": []})
    'a dict'
    """
    if hasattr(obj, "rollout") and not isinstance(obj, type):
        return None  # an instance: checked for `scenarios` after
    inner = obj
    while isinstance(inner, functools.partial):
        inner = inner.func
    origin = getattr(inner, "__module__", None)
    name = getattr(inner, "__name__", type(inner).__name__)
    if _is_stdlib(origin):
        return f"{name} from Python's standard library ({origin})"
    if isinstance(inner, type):
        missing = [m for m in ("scenarios", "rollout") if not hasattr(inner, m)]
        return f"the class {name}, which has no {' and no '.join(missing)}" if missing else None
    if isinstance(inner, types.BuiltinFunctionType | types.BuiltinMethodType):
        return f"{name}, a function written in C ({origin})"
    if not callable(inner):
        return f"a {type(inner).__name__}"
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
    except (TypeError, ValueError, KeyError, OSError) as exc:  # a bad option value, a missing data file
        where = "" if options else None
        raise TaskLoadError(
            f"task {spec!r} could not be built: {type(exc).__name__}: {exc}", option=where
        ) from exc
