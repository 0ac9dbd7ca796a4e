"""An agent framework users use (the OpenAI Agents SDK) drives a tool-calling loop against `grooves serve`."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from pydantic import Field

from grooves.policy.transformers import TransformersPolicy
from grooves.scale.policy_server import ThreadedServer
from grooves.serve.app import create_app


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    set_tracing_disabled(True)  # the SDK would send traces to OpenAI's servers
    policy = TransformersPolicy(str(tiny_model_dir), served_name="tiny")
    with ThreadedServer(create_app(policy, api_key="agent-key")) as s:
        yield s, policy


def weather_agent(base_url: str, calls: list[dict]) -> Agent:
    @function_tool
    def get_weather(
        city: Annotated[str, Field(max_length=8)],
    ) -> str:  # short: the random tiny model ends it sooner
        """Current weather of a city."""
        calls.append({"city": city})
        return f"sunny in {city}"

    client = AsyncOpenAI(base_url=base_url, api_key="agent-key", max_retries=0)
    return Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        tools=[get_weather],
        model=OpenAIChatCompletionsModel(model="tiny", openai_client=client),
        # the first turn must call the tool (the server enforces it with a grammar); the SDK then
        # resets tool_choice, so the second turn answers in text and the loop ends
        model_settings=ModelSettings(tool_choice="required", max_tokens=128, temperature=1.0),
    )


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_the_agents_sdk_runs_a_tool_loop_against_the_server(server, streamed):
    s, policy = server
    calls: list[dict] = []
    agent = weather_agent(s.base_url + "/v1", calls)

    async def go():
        if not streamed:
            return await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
        result = Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=4)
        kinds = [event.type async for event in result.stream_events()]
        assert "raw_response_event" in kinds  # the SDK read the server's stream chunk by chunk
        return result

    before = policy.prompts.tool_calls.parsed
    result = asyncio.run(go())
    assert len(calls) == 1 and len(calls[0]["city"]) <= 8  # the SDK executed the call the model made
    items = [item.type for item in result.new_items]
    assert items[:2] == ["tool_call_item", "tool_call_output_item"] and items[-1] == "message_output_item"
    call = result.new_items[0].raw_item
    assert json.loads(call.arguments) == calls[0]
    assert result.new_items[1].output == f"sunny in {calls[0]['city']}"
    assert isinstance(result.final_output, str)
    assert policy.prompts.tool_calls.parsed == before + 1
