"""Agent environments: enclosed tasks on ephemeral SQLite, with snapshots, graders and a server.

    from grooves.envs import get_env, make_rollout
    env = get_env("support_desk")
    rollout = make_rollout(env, model="policy")       # async (model, scenario) -> Trajectory

Everything a task needs is inside it: seed data, scenarios in train/validation splits, tools with
JSON schemas, and a grader that `env.validate()` proves on gold and known-bad solutions.
"""

from grooves.envs.base import Environment, Episode, Grade, Limits, ValidationReport
from grooves.envs.mcp import McpEnvironment, McpGradeInput, McpServer
from grooves.envs.registry import BUILTINS, get_env
from grooves.envs.rollout import make_rollout, run_episode
from grooves.envs.sqlite import EnvSpec, SqliteEnvironment
from grooves.envs.tools import Tool

__all__ = [
    "BUILTINS",
    "EnvSpec",
    "Environment",
    "Episode",
    "Grade",
    "Limits",
    "McpEnvironment",
    "McpGradeInput",
    "McpServer",
    "SqliteEnvironment",
    "Tool",
    "ValidationReport",
    "get_env",
    "make_rollout",
    "run_episode",
]
