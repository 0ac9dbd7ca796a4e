"""Environments by name: the built-ins, and your own as `module:object`.

Each built-in is a `EnvSpec` in its own module; `get_env` builds the environment (seed
database and scenarios) on request, so importing grooves costs nothing until one is used.
`load_env` takes what every `grooves env` command, `task = "env:..."` and `grooves eval --task`
take: a built-in's name, or `module:object` naming an `EnvSpec`, an `Environment` (a
`SqliteEnvironment`, an `McpEnvironment`, ...), a task wrapping one (`EnvironmentTask`), or a
function or class of yours that returns one when called without arguments.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from grooves.envs.base import Environment, Limits
from grooves.envs.sqlite import EnvSpec, SqliteEnvironment
from grooves.usercode import UserCodeError, describe_unusable, import_object

BUILTINS = ("support_desk", "issue_tracker", "flight_booking", "corpus_search")


def get_spec(name: str) -> EnvSpec:
    if name not in BUILTINS:
        raise KeyError(f"no environment {name!r}; built-ins are {', '.join(BUILTINS)}")
    return import_module(f"grooves.envs.builtin.{name}").SPEC


def get_env(
    name: str, *, seed: int = 0, on_disk: bool = False, limits: Limits | None = None
) -> SqliteEnvironment:
    """A built-in environment; `seed` picks the generated data and scenarios (0 is the reference).

    `on_disk=True` gives each episode a temporary database file instead of memory (for
    databases too large to hold once per concurrent rollout); `limits` overrides the built-in's.
    """
    return SqliteEnvironment(get_spec(name), seed=seed, on_disk=on_disk, limits=limits)


class EnvLoadError(ValueError):
    """An environment name or `module:object` that cannot be used; the message is one line."""


NOT_AN_ENV = (
    "name an EnvSpec, an Environment (SqliteEnvironment, McpEnvironment, ...), or a function of yours "
    "that returns one"
)


def load_env(name: str, *, seed: int = 0) -> Environment:
    """A built-in environment by name, or your own as `module:object` (see the module docstring).

    `seed` is the data seed of a built-in or an `EnvSpec` (0 is the reference); an environment that
    is already built has its own, so a nonzero `seed` is refused for it. Raises `EnvLoadError`, one
    line naming the object and what is wrong.
    """
    if ":" not in name:
        if name not in BUILTINS:
            raise EnvLoadError(
                f"environment {name!r} is not built in ({', '.join(BUILTINS)}) nor a module:object path "
                f"({NOT_AN_ENV})"
            )
        return get_env(name, seed=seed)
    try:
        obj = import_object(name, "environment", f"not an environment: {NOT_AN_ENV}")
    except UserCodeError as exc:
        raise EnvLoadError(str(exc)) from exc
    env = as_environment(obj, name, seed=seed)
    if env is not None:
        return env
    problem = describe_unusable(obj)
    if problem is not None:
        raise EnvLoadError(f"environment {name!r} is {problem}, not an environment: {NOT_AN_ENV}")
    label = getattr(obj, "__name__", type(obj).__name__)
    try:
        made = obj()
    except Exception as exc:  # the user's factory failed: one line saying how
        raise EnvLoadError(
            f"environment {name!r}: calling {label}() raised {type(exc).__name__}: {exc}"
        ) from exc
    env = as_environment(made, name, seed=seed)
    if env is None:
        raise EnvLoadError(
            f"environment {name!r}: {label}() returned a {type(made).__name__}, not an environment: {NOT_AN_ENV}"
        )
    return env


def as_environment(obj: Any, name: str, *, seed: int = 0) -> Environment | None:
    """`obj` as an environment: an `EnvSpec` built (with the data `seed`), an `Environment` as it is,
    a task's `.env`; None for anything else. `name` is what the errors call it."""
    if isinstance(obj, EnvSpec):
        try:
            return SqliteEnvironment(obj, seed=seed)
        except Exception as exc:  # the spec's own seed builder or scenario generator failed
            raise EnvLoadError(f"environment {name!r}: {type(exc).__name__}: {exc}") from exc
    if isinstance(obj, type):
        return None
    env = obj if isinstance(obj, Environment) else getattr(obj, "env", None)
    if env is None or isinstance(env, type) or not isinstance(env, Environment):
        return None
    if seed:
        raise EnvLoadError(
            f"environment {name!r} is built already, with its own data; a data seed ({seed}) applies to a "
            "built-in or an EnvSpec"
        )
    return env
