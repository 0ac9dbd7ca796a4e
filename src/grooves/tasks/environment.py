"""Any grooves environment as a training task: `task = "env:support_desk"` in a run file.

`env:NAME` takes what `grooves env` takes: a built-in's name or your own as `module:object`
(`task = "env:library_desk:SPEC"`), with `task_options` for the wrapper (`seed`, `max_turns`,
`success_threshold`). `EnvironmentTask` also takes an environment object instead of a name (any
`Environment`, such as an `envs.mcp.McpEnvironment` over an MCP server's tools), so a task module
can return `EnvironmentTask(my_env)`; an environment named as a task (`task = "library_desk:SPEC"`)
is wrapped in one with its defaults. The environment's own splits are the scenarios; a rollout is
one episode driven by `envs.rollout.run_episode` with the run's sampling settings; the grader's
score is the reward (its parts are logged as separate signals) and `success_threshold` says which
scores count as solved.
"""

from __future__ import annotations

from typing import Any

from grooves.core.trajectory import Trajectory
from grooves.envs.base import Environment
from grooves.envs.registry import load_env
from grooves.envs.rollout import run_episode
from grooves.rollouts.handle import ModelHandle


class EnvironmentTask:
    """An environment as a task.

    - `env_name`: a built-in's name, `module:object` (see `envs.registry.load_env`), or an
      `Environment` object.
    - `seed`: the data seed of a built-in or an `EnvSpec` (0 is the reference data).
    - `max_turns`: model calls per episode; None is the environment's `limits.max_turns`.
    - `success_threshold`: an episode counts as solved (`metrics["success"]` = 1.0, what
      `success_rate`, `val/success_rate`, `grooves eval`'s success and `--select best` count) when
      its grade is at least this. The default 1.0 counts only full marks: a grader that gives 0.8
      for the right action and 0.2 for a good answer counts a right action with a poor answer as a
      failure; set it to 0.8 to count the action alone. The reward is the grade whatever it is.
    """

    def __init__(
        self,
        env_name: str | Environment,
        seed: int = 0,
        max_turns: int | None = None,
        success_threshold: float = 1.0,
    ):
        if not 0.0 < success_threshold <= 1.0:
            raise ValueError(
                f"success_threshold must be in (0, 1] (a grade at or above it counts as solved), got {success_threshold}"
            )
        if max_turns is not None and max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.env = load_env(env_name, seed=seed) if isinstance(env_name, str) else env_name
        self.name = f"env:{self.env.name}"
        self.max_turns = max_turns
        self.success_threshold = success_threshold

    def scenarios(self, split: str) -> list[dict[str, Any]]:
        return self.env.scenarios(split)  # type: ignore[arg-type]

    async def rollout(self, model: ModelHandle, scenario: dict[str, Any]) -> Trajectory:
        traj = await run_episode(
            model,
            self.env,
            scenario,
            model=model.name,
            max_turns=self.max_turns,
            temperature=model.temperature,
            max_tokens=model.max_tokens,
        )
        traj.metrics["success"] = float(traj.reward >= self.success_threshold)
        return traj
