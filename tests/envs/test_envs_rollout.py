"""The rollout loop: scripted clients drive environments into graded trajectories; then a real model."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from openai.types.chat import ChatCompletion

from grooves.envs import get_env, make_rollout, run_episode
from grooves.envs.builtin.answers import money
from grooves.rollouts.gather import gather

Agent = Callable[[list[dict[str, Any]]], tuple[str, list[tuple[str, Any]]]]
"""messages so far -> (content, [(tool name, arguments)]): a scripted policy."""


class ScriptedClient:
    """An OpenAI-style async client whose 'model' is a Python function; answers are grooves-shaped.

    Each choice carries token_ids / prompt_token_ids / sampled_logprobs as a grooves policy server
    returns them, so `Trajectory.add_choice` records it exactly as in training.
    """

    def __init__(self, agent: Agent):
        self.agent = agent
        self.requests: list[dict[str, Any]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    async def _create(self, *, model, messages, tools, logprobs, temperature, max_tokens) -> ChatCompletion:
        self.requests.append(
            {
                "model": model,
                "messages": copy.deepcopy(messages),
                "tools": tools,
                "logprobs": logprobs,
                "temperature": temperature,
                "max_tokens": max_tokens,
            }
        )
        content, calls = self.agent(messages)
        n = len(self.requests)
        tool_calls = [
            {
                "id": f"call_{n}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
            for i, (name, args) in enumerate(calls)
        ]
        message = {"role": "assistant", "content": content or None, "tool_calls": tool_calls or None}
        tokens = list(range(100 + n, 100 + n + max(1, len(content or "") // 4 + 2 * len(calls))))
        return ChatCompletion.model_validate(
            {
                "id": f"cmpl-{n}",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls" if calls else "stop",
                        "message": message,
                        "token_ids": tokens,
                        "prompt_token_ids": list(range(10 * n)),
                        "sampled_logprobs": [-0.5] * len(tokens),
                        "adapter_version": 3,
                    }
                ],
            }
        )


def tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in messages if m.get("role") == "tool"]


def support_agent(scenario: dict[str, Any]) -> Agent:
    """Follows the refund workflow step by step, reading ids from earlier tool replies."""
    product = scenario["product"]

    def agent(messages):
        seen = tool_results(messages)
        if not seen:
            return "", [("find_customer", {"email": scenario["email"]})]
        if len(seen) == 1:
            return "Looking up orders.", [("list_orders", {"customer_id": seen[0]["id"]})]
        if len(seen) == 2:
            order = next(o for o in seen[1]["orders"] if o["product"] == product)
            return "", [("refund_order", {"order_id": order["order_id"], "reason": "requested"})]
        return f"I refunded order {seen[2]['refunded']}: {seen[2]['amount']}.", []

    return agent


def refund_scenario(env):
    return next(s for s in env.scenarios("train") if s["expected"]["action"] == "refund")


def test_run_episode_records_turns_tool_messages_and_grade():
    env = get_env("support_desk")
    scenario = refund_scenario(env)
    client = ScriptedClient(support_agent(scenario))
    traj = asyncio.run(
        run_episode(client, env, scenario, model="policy", max_turns=6, temperature=0.7, max_tokens=64)
    )
    assert traj.error is None
    assert traj.reward == 1.0
    assert traj.rewards == {"policy": 1.0, "truthful": 1.0, "action": 1.0, "answer": 1.0}
    assert len(traj.turns) == 4 and len(client.requests) == 4
    assert all(t.adapter_version == 3 and len(t.logprobs) == len(t.token_ids) for t in traj.turns)
    roles = [m["role"] for m in traj.messages]
    assert roles == ["system", "user"] + ["assistant", "tool"] * 3 + ["assistant"]
    for asked, answered in zip(traj.messages[2:8:2], traj.messages[3:8:2], strict=True):
        assert answered["tool_call_id"] == asked["tool_calls"][0]["id"]
    amount = money(scenario["expected"]["amount_cents"])
    assert traj.messages[-1]["content"] == f"I refunded order {scenario['expected']['order_id']}: {amount}."
    first = client.requests[0]
    assert first["logprobs"] is True and first["temperature"] == 0.7 and first["max_tokens"] == 64
    assert {t["function"]["name"] for t in first["tools"]} >= {"refund_order", "find_customer"}
    assert len(client.requests[-1]["messages"]) == 8  # the model saw every tool reply
    assert traj.metrics["env_tool_calls"] == 3 and traj.metrics["env_tool_errors"] == 0
    assert traj.metrics["answered"] == 1.0 and traj.metadata["stop_reason"] == "answer"
    assert traj.metadata["scenario_id"] == scenario["id"]


def test_bad_tool_calls_from_the_model_are_tool_errors_and_the_episode_goes_on():
    env = get_env("support_desk")
    scenario = refund_scenario(env)
    good = support_agent(scenario)
    script = iter(
        [
            ("", [("find_customer", "{not json"), ("no_such_tool", "{}")]),
            ("", [("find_customer", {"email": scenario["email"], "extra": 1})]),
        ]
    )

    def agent(messages):
        step = next(script, None)
        if step is not None:
            return step
        clean = [m for m in messages if not (m.get("role") == "tool" and "error" in json.loads(m["content"]))]
        return good(clean)

    traj = asyncio.run(run_episode(ScriptedClient(agent), env, scenario, model="policy", max_turns=8))
    errors = [r["error"] for r in tool_results(traj.messages) if "error" in r]
    assert errors == ["invalid_json", "unknown_tool", "schema_violation"]
    assert traj.metrics["env_tool_errors"] == 3
    assert traj.reward == 1.0


def test_max_turns_stops_a_looping_agent_and_it_scores_zero():
    env = get_env("issue_tracker")
    scenario = env.scenarios("validation")[0]
    client = ScriptedClient(lambda messages: ("", [("get_issue", {"key": "WEB-1"})]))
    traj = asyncio.run(run_episode(client, env, scenario, model="policy", max_turns=3))
    assert len(client.requests) == 3
    assert traj.metadata["stop_reason"] == "max_turns"
    assert traj.reward == 0.0 and traj.metrics["answered"] == 0.0


def test_latency_budget_gives_one_last_turn_then_stops():
    env = get_env("corpus_search")
    scenario = env.scenarios("validation")[0]
    client = ScriptedClient(lambda messages: ("", [("search", {"query": "town", "k": 2})] * 3))
    traj = asyncio.run(run_episode(client, env, scenario, model="policy", max_turns=10))
    # 1.5 s per search, 12 s budget: 8 searches run, then refusals; turn 3 ends with the budget
    # spent, turn 4 is the grace turn and the agent still calls tools, so the episode stops.
    assert len(client.requests) == 4
    assert traj.metadata["stop_reason"] == "budget"
    assert [r.get("error") for r in tool_results(traj.messages)].count("budget_exhausted") == 1
    assert traj.metrics["env_elapsed_s"] == 12.0 and traj.rewards["within_budget"] == 0.0


def test_make_rollout_trains_through_gather():
    env = get_env("support_desk")
    scenarios = [s for s in env.scenarios("train") if s["expected"]["action"] == "refund"][:2]
    rollout = make_rollout(env, model="policy", max_turns=6)

    class PerScenario:
        """One scripted client per call; the agent is picked from the scenario in the chat."""

        def __init__(self):
            self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

        async def _create(self, **request):
            scenario = next(s for s in scenarios if s["prompt"] == request["messages"][1]["content"])
            return await ScriptedClient(support_agent(scenario))._create(**request)

    groups = asyncio.run(gather(rollout, PerScenario(), scenarios, group_size=2, progress=False))
    assert [len(g) for g in groups] == [2, 2]
    assert [t.reward for g in groups for t in g.trajectories] == [1.0, 1.0, 1.0, 1.0]


@pytest.fixture(scope="module")
def tiny_client(tiny_model_dir):
    from grooves.policy.transformers import TransformersPolicy
    from grooves.serve.app import inprocess_client

    policy = TransformersPolicy(str(tiny_model_dir), served_name="tiny", max_context=8192)
    return inprocess_client(policy)


def test_a_real_episode_through_the_policy_server(tiny_client):
    env = get_env("corpus_search")
    scenario = env.scenarios("validation")[0]
    traj = asyncio.run(run_episode(tiny_client, env, scenario, model="tiny", max_turns=2, max_tokens=12))
    assert traj.error is None
    assert 1 <= len(traj.turns) <= 2
    turn = traj.turns[0]
    assert len(turn.token_ids) == len(turn.logprobs) >= 1
    assert all(lp <= 0.0 for lp in turn.logprobs)
    assert len(turn.prompt_token_ids) > 100  # the tools and the question were rendered
    assert 0.0 <= traj.reward <= 1.0 and set(traj.rewards) == {"correct", "cited", "within_budget"}
    assert traj.metadata["stop_reason"] in {"answer", "max_turns"}
