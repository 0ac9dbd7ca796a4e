"""Agent environments: enclosed tasks on ephemeral SQLite, with snapshots, graders and a server.

    from grooves.envs import get_env, make_rollout
    env = get_env("support_desk")
    rollout = make_rollout(env, model="policy")       # async (model, scenario) -> Trajectory

Everything a task needs is inside it: seed data, scenarios in train/validation splits, tools with
JSON schemas, and a grader that `env.validate()` proves on gold and known-bad solutions.

What an environment's author imports from here (docs/environments.md, "Write your own
environment", walks through them; examples/envs/library_desk.py uses them all):

- the parts of a SQLite environment: `EnvSpec` (seed builder, scenario generator, tools, grader,
  gold and bad solvers), `SqliteEnvironment` (the environment built from one), `assign_splits`
  (ids and train/validation/test splits for the generated scenarios);
- tools: `Tool` (a function `fn(ctx, args)` with its JSON schema), `ToolContext` (what a tool
  reaches: `ctx.state`, `ctx.scenario`, `ctx.seed`), `ToolError` (a refusal the agent reads as
  `{"error": "refused", "message": ...}`), and the schema helpers `obj`, `string`, `integer`;
- state: `SeedDatabase` (the data every episode starts from, `seed.connection`), `SqliteState`
  (one episode's database: `query`, `one`, `execute`), `changed_keys` (rows that differ between
  two databases), `like_pattern` (a LIKE pattern with its wildcards escaped);
- grading and solvers: `GradeInput` (what a grader reads: scenario, final state, seed, messages,
  answer, calls), `Grade`, `Call` (the `call(tool, arguments)` a scripted solver acts through),
  `Solver`, `play` (run a solver through an episode); `ValidationReport`;
- loading and running: `get_env` (a built-in), `load_env` (a built-in or `module:object`),
  `make_rollout`, `run_episode`; MCP: `McpEnvironment`, `McpServer`, `McpGradeInput`.

Names are imported when first used, so `import grooves.envs` does not load the MCP SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Environment": "grooves.envs.base",
    "Episode": "grooves.envs.base",
    "Grade": "grooves.envs.base",
    "Limits": "grooves.envs.base",
    "ValidationReport": "grooves.envs.base",
    "McpEnvironment": "grooves.envs.mcp",
    "McpGradeInput": "grooves.envs.mcp",
    "McpServer": "grooves.envs.mcp",
    "BUILTINS": "grooves.envs.registry",
    "get_env": "grooves.envs.registry",
    "load_env": "grooves.envs.registry",
    "make_rollout": "grooves.envs.rollout",
    "run_episode": "grooves.envs.rollout",
    "Call": "grooves.envs.sqlite",
    "EnvSpec": "grooves.envs.sqlite",
    "GradeInput": "grooves.envs.sqlite",
    "Solver": "grooves.envs.sqlite",
    "SqliteEnvironment": "grooves.envs.sqlite",
    "assign_splits": "grooves.envs.sqlite",
    "play": "grooves.envs.sqlite",
    "SeedDatabase": "grooves.envs.state",
    "SqliteState": "grooves.envs.state",
    "changed_keys": "grooves.envs.state",
    "like_pattern": "grooves.envs.state",
    "Tool": "grooves.envs.tools",
    "ToolContext": "grooves.envs.tools",
    "ToolError": "grooves.envs.tools",
    "integer": "grooves.envs.tools",
    "obj": "grooves.envs.tools",
    "string": "grooves.envs.tools",
}
"""Public name -> the module that defines it: the one list of what `grooves.envs` exports, which
`__all__` and `__getattr__` (the import on first use) both read."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'grooves.envs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return __all__


# what a type checker and an editor see of the names above: the same names from the same modules
# (tests/test_public.py holds them to `_EXPORTS`); `__all__` is built from the table, so ruff
# cannot tell that these imports are the exports
# ruff: noqa: F401
if TYPE_CHECKING:
    from grooves.envs.base import Environment, Episode, Grade, Limits, ValidationReport
    from grooves.envs.mcp import McpEnvironment, McpGradeInput, McpServer
    from grooves.envs.registry import BUILTINS, get_env, load_env
    from grooves.envs.rollout import make_rollout, run_episode
    from grooves.envs.sqlite import (
        Call,
        EnvSpec,
        GradeInput,
        Solver,
        SqliteEnvironment,
        assign_splits,
        play,
    )
    from grooves.envs.state import SeedDatabase, SqliteState, changed_keys, like_pattern
    from grooves.envs.tools import Tool, ToolContext, ToolError, integer, obj, string
