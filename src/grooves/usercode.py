"""Importing the user's own code named `module:object`: a task, an environment, a reward.

`grooves train` and `grooves sft` put the run file's folder first on the import path
(`add_code_folder`), and `grooves eval` and `grooves env` put the working folder there, so a
module beside the run file, or in the folder a command runs from, imports without PYTHONPATH.
Every failure is one line that names the setting and what to do: a module that cannot be imported
(with where Python looked), a module whose own code raised while importing, a missing attribute,
and objects that obviously cannot be what the setting asks for (anything from Python's standard
library, such as `os:system`, a function written in C, a plain value), refused before they are
called. That guards against a slip, not against a hostile module: importing a module runs it.
"""

from __future__ import annotations

import functools
import importlib
import sys
import types
from pathlib import Path
from typing import Any

_CODE_FOLDER: list[tuple[str, str]] = []
"""(what it is, path) of the folder last put on the import path (the run file's or the working
folder), named when an import fails."""


class UserCodeError(ValueError):
    """A `module:object` that cannot be imported or used; the message is one line."""


def add_code_folder(folder: str | Path) -> None:
    """Put `folder` first on the import path, so `task = "mytask:MyTask"` finds a `mytask.py` there."""
    _add("the run file's folder", Path(folder).resolve())


def add_working_folder() -> None:
    """Put the working folder on the import path (as `python -m` does), for commands without a run file."""
    _add("the working folder", Path.cwd())


def _add(what: str, folder: Path) -> None:
    path = str(folder)
    if path not in sys.path:
        sys.path.insert(0, path)
    _CODE_FOLDER[:] = [(what, path)]


def is_stdlib(module_name: str | None) -> bool:
    return bool(module_name) and module_name.partition(".")[0] in sys.stdlib_module_names  # type: ignore[union-attr]


def import_object(spec: str, what: str, refusal: str = "not yours") -> Any:
    """The object `module:object` names; `what` ("task", "environment") starts each error line and
    `refusal` ends the one for a module of Python's standard library.

    >>> import_object("grooves.usercode:is_stdlib", "task").__name__
    'is_stdlib'
    >>> import_object("os:sep", "environment")
    Traceback (most recent call last):
    ...
    grooves.usercode.UserCodeError: environment 'os:sep': os is Python's standard library, not yours
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UserCodeError(f"{what} {spec!r}: write it as module:object (a file module.py holding object)")
    if is_stdlib(module_name):  # refused before importing anything
        raise UserCodeError(f"{what} {spec!r}: {module_name} is Python's standard library, {refusal}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        folders = [(label, f) for label, f in _CODE_FOLDER if f in sys.path]
        looked = "".join(f"{label} ({f}), " for label, f in folders)
        beside = "beside the run file" if "the run file's folder" in looked else "in the working folder"
        raise UserCodeError(
            f"{what} {spec!r}: cannot import {module_name}: {exc}; Python looked in {looked}the running "
            f"script's folder, PYTHONPATH and the installed packages: put the module {beside}, add its "
            "folder to PYTHONPATH, or pip install its package"
        ) from exc
    except Exception as exc:  # the module's own code failed while importing; say how, on one line
        raise UserCodeError(
            f"{what} {spec!r}: importing {module_name} raised {type(exc).__name__}: {exc}"
        ) from exc
    if not hasattr(module, attr):
        raise UserCodeError(f"{what} {spec!r}: cannot import: module {module_name} has no attribute {attr!r}")
    return getattr(module, attr)


def describe_unusable(obj: Any) -> str | None:
    """What `obj` is when it obviously cannot be a factory of the user's (a class or function to
    call): a function of Python's standard library, one written in C, or a plain value; None when it
    may be one. Callers accept their own kind of instance (a task, an environment) before asking.

    >>> import os
    >>> describe_unusable(os.system)
    "system from Python's standard library (posix)"
    >>> describe_unusable({"scenarios": []})
    'a dict'
    """
    inner = obj
    while isinstance(inner, functools.partial):
        inner = inner.func
    origin = getattr(inner, "__module__", None)
    name = getattr(inner, "__name__", type(inner).__name__)
    if isinstance(inner, type) or callable(inner):
        if is_stdlib(origin):
            return f"{name} from Python's standard library ({origin})"
        if isinstance(inner, types.BuiltinFunctionType | types.BuiltinMethodType):
            return f"{name}, a function written in C ({origin})"
        return None
    return f"a {type(inner).__name__}"
