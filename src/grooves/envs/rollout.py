"""Run a policy through an environment: the multi-turn tool loop that produces a `Trajectory`.

The policy is reached only through an OpenAI-style async client, and the environment only
through the `Environment`/`Episode` contract, so the same loop drives a local environment or a
remote one, a grooves policy server or any compatible endpoint. Every sampled turn goes through
`Trajectory.add_choice`, which keeps the exact token ids for training; tool replies are appended
as `tool` messages; the grade becomes the reward and its parts become `rewards`.

Episode calls run in a worker thread: they are fast locally, but a remote episode does network
I/O, and neither should stall the other rollouts sharing the event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from grooves.core.trajectory import Trajectory
from grooves.envs.base import Environment, Episode, Scenario
from grooves.rollouts.gather import RolloutFn
from grooves.rollouts.handle import ModelHandle


def _tool_calls(choice: Any) -> list[Any]:
    message = choice["message"] if isinstance(choice, dict) else choice.message
    calls = message.get("tool_calls") if isinstance(message, dict) else message.tool_calls
    return list(calls or [])


async def run_episode(
    client: Any,
    env: Environment,
    scenario: Scenario,
    *,
    model: str,
    max_turns: int | None = None,
    temperature: float = 1.0,
    max_tokens: int = 512,
) -> Trajectory:
    """One rollout of `scenario`: sample, run tool calls, repeat; stop on an answer or a limit.

    Stops when the model answers without calling a tool, after `max_turns` model calls (default:
    the environment's limit), or when the model keeps calling tools after the latency budget is
    spent (it gets one turn to answer first). `metadata["stop_reason"]` says which.
    """
    turns = max_turns if max_turns is not None else env.limits.max_turns
    if turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {turns}")
    episode: Episode = await asyncio.to_thread(env.reset, scenario)
    try:
        traj = Trajectory(
            messages=list(episode.messages),
            tools=episode.tools,
            metadata={"env": env.name, "scenario_id": scenario.get("id"), "split": scenario.get("split")},
        )
        stop_reason, model_calls, after_budget = "max_turns", 0, False
        for _ in range(turns):
            if isinstance(client, ModelHandle):  # the trainer's handle: run settings and reproducible seeds
                choice = await client.complete(traj.messages, traj.tools)
            else:
                completion = await client.chat.completions.create(
                    model=model,
                    messages=traj.messages,
                    tools=traj.tools,
                    logprobs=True,
                    temperature=temperature,
                    max_tokens=max_tokens,
                )
                choice = completion.choices[0]
            model_calls += 1
            traj.add_choice(choice)
            calls = _tool_calls(choice)
            if not calls:
                stop_reason = "answer"
                break
            if after_budget:
                stop_reason = "budget"
                break
            for call in calls:
                traj.messages.append(await asyncio.to_thread(episode.step, call))
            after_budget = await asyncio.to_thread(lambda: episode.done)
        grade = await asyncio.to_thread(episode.grade, traj)
        traj.reward = grade.score
        traj.rewards = dict(grade.parts)
        traj.metrics.update(await asyncio.to_thread(episode.metrics))
        traj.metrics.update({"model_calls": float(model_calls), "answered": float(stop_reason == "answer")})
        traj.metadata.update({"stop_reason": stop_reason, "grade_notes": list(grade.notes)})
        return traj
    finally:
        await asyncio.to_thread(episode.close)


def make_rollout(
    env: Environment,
    *,
    model: str,
    max_turns: int | None = None,
    temperature: float = 1.0,
    max_tokens: int = 512,
) -> RolloutFn:
    """`async def rollout(model, scenario) -> Trajectory` for `gather` and the trainer; `model` (the
    make_rollout argument) names the served model when a rollout is handed a plain client."""
    name = model

    async def rollout(model: ModelHandle, scenario: dict[str, Any]) -> Trajectory:
        return await run_episode(
            model,
            env,
            scenario,
            model=name,
            max_turns=max_turns,
            temperature=temperature,
            max_tokens=max_tokens,
        )

    return rollout
