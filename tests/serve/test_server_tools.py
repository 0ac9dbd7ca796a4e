"""Tool calls through `grooves serve`, driven by the real `openai` client.

A forced call takes only the arguments its tool declares; `parallel_tool_calls: false` holds every
tool_choice to one call.
"""

from __future__ import annotations

import json

import pytest
from agents import function_tool
from agents.models.chatcmpl_converter import Converter
from openai import OpenAI

from grooves.policy.transformers import TransformersPolicy
from grooves.scale.policy_server import ThreadedServer
from grooves.serve.app import create_app
from tiny_models import teach_answer

NOW = {"type": "function", "function": {"name": "now", "description": "Current time."}}
"""A tool without parameters, as smolagents declares one that takes no inputs."""
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {  # no additionalProperties, as most frameworks write a schema
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
        },
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
TWO_CALLS = (
    '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
    '{"name": "get_weather", "arguments": {"city": "Rome"}}]</tool_call>'
)
RAN: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """Current weather of a city."""
    RAN.append(city)
    return f"sunny in {city}"


SDK_WEATHER = Converter.tool_to_openai(get_weather)
"""The tool as the OpenAI Agents SDK sends it (a strict schema), so a model taught on it answers the SDK alike."""


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TransformersPolicy(str(tiny_model_dir), served_name="tiny")


@pytest.fixture(scope="module")
def client(policy):
    with ThreadedServer(create_app(policy)) as server:
        yield OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def two_calls(tiny_model_dir):
    """A tiny model whose greedy answer to QUESTION with SDK_WEATHER is TWO_CALLS, served; (policy, base URL)."""
    policy = TransformersPolicy(str(tiny_model_dir), served_name="tiny")
    teach_answer(policy, QUESTION, [SDK_WEATHER], TWO_CALLS)
    with ThreadedServer(create_app(policy)) as server:
        yield policy, server.base_url + "/v1"


def calls_of(message) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


# ---- a forced call takes only the declared arguments (smolagents refuses any other key) ---------


@pytest.mark.parametrize(
    "tools,choice,declared",
    [
        ([NOW], "required", set()),
        ([NOW], {"type": "function", "function": {"name": "now"}}, set()),
        ([WEATHER], "required", {"city"}),
    ],
    ids=["no parameters, required", "no parameters, named", "no additionalProperties"],
)
def test_a_forced_call_takes_only_the_arguments_its_tool_declares(client, tools, choice, declared):
    resp = client.chat.completions.create(
        model="tiny", messages=QUESTION, tools=tools, tool_choice=choice, n=8, seed=0, max_tokens=64
    )
    for c in resp.choices:
        # before: the grammar let the model add keys ({"argument1": ...} from the prompt's example),
        # and its keys ran on until max_tokens cut them, leaving markup in content
        assert c.finish_reason == "tool_calls" and c.message.content is None
        for name, arguments in calls_of(c.message):
            assert name == tools[0]["function"]["name"]
            args = json.loads(arguments)
            assert set(args) <= declared  # what smolagents checks ("... is not in the tool's input schema")
            if not declared:
                assert arguments == "{}"


# ---- parallel_tool_calls: false ------------------------------------------------------------------


def test_parallel_tool_calls_false_holds_the_answer_to_one_call(two_calls):
    policy, base_url = two_calls
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    for choice in ("auto", "required"):
        request = dict(
            model="tiny",
            messages=QUESTION,
            tools=[SDK_WEATHER],
            tool_choice=choice,
            temperature=0,
            max_tokens=64,
        )
        both = client.chat.completions.create(**request).choices[0]
        assert calls_of(both.message) == [
            ("get_weather", '{"city": "Paris"}'),
            ("get_weather", '{"city": "Rome"}'),
        ]
        # before: with "auto", a 400 ("only enforced with a forced tool_choice")
        one = client.chat.completions.create(**request, parallel_tool_calls=False).choices[0]
        assert calls_of(one.message) == [("get_weather", '{"city": "Paris"}')], choice
        assert one.finish_reason == "tool_calls" and one.message.content is None


def test_parallel_tool_calls_false_under_auto_allows_text_without_a_call(client):
    resp = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello"}],
        tools=[WEATHER, NOW],
        parallel_tool_calls=False,
        n=8,
        seed=0,
        max_tokens=16,
    )
    for c in resp.choices:
        assert len(c.message.tool_calls or []) <= 1
        assert "<tool_call>" not in (c.message.content or "")
    assert any(c.message.content for c in resp.choices)  # the random model mostly writes text
