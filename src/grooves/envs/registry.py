"""The built-in environments by name.

Each built-in is a `EnvSpec` in its own module; `get_env` builds the environment (seed
database and scenarios) on request, so importing grooves costs nothing until one is used.
"""

from __future__ import annotations

from importlib import import_module

from grooves.envs.base import Limits
from grooves.envs.sqlite import EnvSpec, SqliteEnvironment

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
