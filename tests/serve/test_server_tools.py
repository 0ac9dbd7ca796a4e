"""Tool calls through `grooves serve`, driven by the real `openai` client.

A forced call takes only the arguments its tool declares.
"""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from grooves.policy.transformers import TransformersPolicy
from grooves.scale.policy_server import ThreadedServer
from grooves.serve.app import create_app

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


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TransformersPolicy(str(tiny_model_dir), served_name="tiny")


@pytest.fixture(scope="module")
def client(policy):
    with ThreadedServer(create_app(policy)) as server:
        yield OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


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
