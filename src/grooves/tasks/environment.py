"""Any grooves environment as a training task: `task = "env:support_desk"` in a run file.

`EnvironmentTask` also takes an environment object instead of a name (any `Environment`, such as
an `envs.mcp.McpEnvironment` over an MCP server's tools), so a task module can return
`EnvironmentTask(my_env)`. The environment's own train/validation splits are the scenarios; a
rollout is one episode driven by `envs.rollout.run_episode` with the run's sampling settings, and the grader's score is the
reward (its parts are logged as separate signals).
"""

from __future__ import annotations

from typing import Any

from grooves.core.trajectory import Trajectory
from grooves.envs import Environment, get_env
from grooves.envs.rollout import run_episode
from grooves.rollouts.handle import ModelHandle


class EnvironmentTask:
    def __init__(
        self,
        env_name: str | Environment,
        seed: int = 0,
        max_turns: int | None = None,
        success_threshold: float = 1.0,
    ):
        self.env = get_env(env_name, seed=seed) if isinstance(env_name, str) else env_name
        self.name = f"env:{self.env.name}"
        self.max_turns = max_turns
        self.success_threshold = success_threshold

    def scenarios(self, split: str) -> list[dict[str, Any]]:
        return self.env.scenarios(split)

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
