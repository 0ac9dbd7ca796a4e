"""The `[judge]` section as the run's group scorer: a group judge mixed with the task's reward.

    reward = (1 - weight) x task reward + weight x judge score      (0 if judge score < gate)

Built on `rewards.Composite` (the same code a Python user composes by hand): a code signal
`task` that reads the reward the task's rollout set (or calls `judge.reward`), and a judge
signal `judge` from `judge.GroupJudge` (all rollouts of a scenario in one request, RULER-style).
Both scores stay in `trajectory.rewards`, so a rising reward can be traced to the one that moved.
"""

from __future__ import annotations

import importlib
from typing import Any

from grooves.config import ConfigError, RunJudgeConfig
from grooves.core.trajectory import Trajectory, TrajectoryGroup
from grooves.judge import (
    DEFAULT_RUBRIC,
    GroupJudge,
    JudgeClient,
    JudgeConfig,
    JudgeError,
    RubricError,
    load_rubric,
)
from grooves.rewards import Composite, RewardFn, StepScores, Term, code
from grooves.rewards.compose import JudgeSignal


def task_reward(trajectory: Trajectory, scenario: dict[str, Any]) -> float:
    """The reward the task's rollout gave (an environment's grader score): read before the mix."""
    return trajectory.reward


def code_reward(path: str) -> RewardFn:
    """The function `package.module:function` names; `ConfigError` naming `judge.reward` otherwise."""
    module, _, name = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name) if name else None
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"judge.reward: {path}: {exc}; name a function as package.module:function"
        ) from None
    if not callable(fn):
        raise ConfigError(f"judge.reward: {path}: not a function; name one as package.module:function")
    return fn


class JudgeScorer:
    """`training.loop.run`'s group scorer for a `[judge]` section; `start()` checks it in one line each.

    The judge client is made in the run's event loop (its HTTP connections belong to it) and
    closed by `aclose()` when the run ends.
    """

    def __init__(self, section: RunJudgeConfig, *, seed: int = 0):
        self.section = section
        self.seed = seed
        try:
            self.rubric = load_rubric(section.rubric) if section.rubric else DEFAULT_RUBRIC
        except RubricError as exc:
            raise ConfigError(f"judge.rubric: {exc}") from None
        self.base = code_reward(section.reward) if section.reward else task_reward
        self.client_config = JudgeConfig(
            base_url=section.base_url,
            model=section.model,
            timeout_s=section.timeout_s,
            max_retries=section.max_retries,
            concurrency=section.concurrency,
            max_tokens=section.max_tokens,
            **({} if section.cache else {"cache_path": None}),
        )
        try:
            self.client_config = self.client_config.resolved()
        except JudgeError as exc:  # no endpoint or model: say which field
            field = "judge.base_url" if "base_url" in str(exc) else "judge.model"
            raise ConfigError(f"{field}: {exc}") from None
        self.client: JudgeClient | None = None
        self.reward: Composite | None = None

    async def start(self) -> None:
        """Make the client and ask the endpoint whether it serves the model: a judge that is down
        or a misspelt model stops the run before it trains, in one line."""
        self.client = JudgeClient(self.client_config, seed=self.seed)
        try:
            await self.client.check()
        except JudgeError as exc:
            await self.aclose()
            raise ConfigError(f"judge: {exc}") from None
        s = self.section
        judge = GroupJudge(self.client, self.rubric, seed=self.seed, judge_twice=s.judge_twice)
        self.reward = Composite(
            [
                code("task", self.base, weight=1.0 - s.weight),
                Term("judge", JudgeSignal(judge, "judge"), weight=s.weight, gate=s.gate),
            ]
        )

    async def __call__(self, groups: list[TrajectoryGroup]) -> StepScores:
        if self.reward is None:
            await self.start()
        assert self.reward is not None
        return await self.reward.score_groups(groups)

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None
