"""grooves: train small open-weight agent models with GRPO-family RL on LoRA adapters.

What user code needs, in one place (each name is imported when first used, so `import grooves`
stays light):

- the contracts a user implements: `Task` (scenarios + an async rollout), `Environment` (tools,
  state and a grader; `EnvironmentTask` runs one as a task), and the records a rollout returns,
  `Trajectory` (one rollout) in a `TrajectoryGroup` (the rollouts of one scenario);
- what a rollout talks through: `ModelHandle` (an OpenAI client plus the run's sampling
  settings), and `gather`, which runs groups of rollouts concurrently;
- training: `load_config` (a run file; `parse_overrides` reads `--set` lines, `dump_config` writes
  one), `load_task` (a task by name or `module:object`) and `train` (the RL loop; `[sft]` first
  when the run file has one); `ScenarioStream` (a split's scenarios in the trainer's resumable
  order) and `TrainableModel` for your own loop against `grooves serve --train`; `write_report`
  (a run folder's HTML report); `ensure_model` (SmolLM2-135M, offline);
- what `train` raises: `ConfigError` (a run file that cannot be used), `RunFolderError` (a run
  folder in use or holding another run), `CheckpointError` (a checkpoint that cannot be used) and,
  on Ctrl-C, `RunInterrupted` (a `KeyboardInterrupt` that says where the run stopped);
- environments: `get_env` (a built-in by name), and the SQLite runtime's parts for your own:
  `EnvSpec`, `SqliteEnvironment`, `Tool`.

Beside these, the packages `grooves.judge` (rubrics and judges), `grooves.rewards` (composite
rewards, reward models), `grooves.watch` (the reward-hacking watch), `grooves.envs` (environments,
MCP), `grooves.tasks` (built-in tasks) and `grooves.remote` export their own public names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "SampledTurn": "grooves.core.trajectory",
    "Trajectory": "grooves.core.trajectory",
    "TrajectoryGroup": "grooves.core.trajectory",
    "ModelHandle": "grooves.rollouts.handle",
    "gather": "grooves.rollouts.gather",
    "Task": "grooves.tasks",
    "EnvironmentTask": "grooves.tasks.environment",
    "Environment": "grooves.envs.base",
    "get_env": "grooves.envs.registry",
    "EnvSpec": "grooves.envs.sqlite",
    "SqliteEnvironment": "grooves.envs.sqlite",
    "Tool": "grooves.envs.tools",
    "RunConfig": "grooves.config",
    "ConfigError": "grooves.config",
    "load_config": "grooves.config",
    "parse_overrides": "grooves.config",
    "dump_config": "grooves.config",
    "load_task": "grooves.tasks",
    "ScenarioStream": "grooves.training.data",
    "train": "grooves.training.loop",
    "RunInterrupted": "grooves.training.loop",
    "RunFolderError": "grooves.training.runlog",
    "CheckpointError": "grooves.training.checkpoint",
    "write_report": "grooves.report.write",
    "ensure_model": "grooves.models",
    "TrainableModel": "grooves.remote.model",
}
"""Public name -> the module that defines it: the one list of what `grooves` exports, which
`__all__` and `__getattr__` (the import on first use) both read."""

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'grooves' has no attribute {name!r}")
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
    from grooves.config import ConfigError, RunConfig, dump_config, load_config, parse_overrides
    from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup
    from grooves.envs.base import Environment
    from grooves.envs.registry import get_env
    from grooves.envs.sqlite import EnvSpec, SqliteEnvironment
    from grooves.envs.tools import Tool
    from grooves.models import ensure_model
    from grooves.remote.model import TrainableModel
    from grooves.report.write import write_report
    from grooves.rollouts.gather import gather
    from grooves.rollouts.handle import ModelHandle
    from grooves.tasks import Task, load_task
    from grooves.tasks.environment import EnvironmentTask
    from grooves.training.checkpoint import CheckpointError
    from grooves.training.data import ScenarioStream
    from grooves.training.loop import RunInterrupted, train
    from grooves.training.runlog import RunFolderError
