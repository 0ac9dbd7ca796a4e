"""Tool calls through `grooves serve`, driven by the real `openai` client (and the OpenAI Agents SDK).

A forced call takes only the arguments its tool declares; a call cut at max_tokens comes back as a
call with its arguments as far as written, never as markup in `content`, streamed or not;
`parallel_tool_calls: false` holds every tool_choice to one call; a grammar that reaches a limit
while sampling is a 400 naming the field.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.models.chatcmpl_converter import Converter
from openai import AsyncOpenAI, BadRequestError, OpenAI

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
CALL_PREFIX = '<tool_call>[{"name": "get_weather", "arguments": {"city": "'
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


def streamed(client, **request) -> dict[int, dict]:
    """Per choice index: the content, the calls (name, arguments) and the finish reason the client assembles."""
    out: dict[int, dict] = {}
    for chunk in client.chat.completions.create(stream=True, **request):
        for c in chunk.choices:
            got = out.setdefault(c.index, {"content": "", "calls": {}, "finish": None})
            got["content"] += c.delta.content or ""
            for call in c.delta.tool_calls or []:
                slot = got["calls"].setdefault(call.index, ["", ""])
                slot[0] += call.function.name or ""
                slot[1] += call.function.arguments or ""
            got["finish"] = c.finish_reason or got["finish"]
    return out


def calls_of(message) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or []]


def tokens_to_cut(policy, text: str, inside: str) -> int:
    """How many of `text`'s tokens end it just past the first `inside`."""
    ids = policy.tokenizer(text, add_special_tokens=False)["input_ids"]
    return next(k for k in range(len(ids) + 1) if inside in policy.tokenizer.decode(ids[:k]))


def cut_two_calls(policy) -> tuple[int, str]:
    """(max_tokens that cut TWO_CALLS inside its second call's arguments, those arguments as far as written)."""
    max_tokens = tokens_to_cut(policy, TWO_CALLS, '{"city": "R')
    ids = policy.tokenizer(TWO_CALLS, add_special_tokens=False)["input_ids"]
    second = policy.tokenizer.decode(ids[:max_tokens]).split('"arguments": ')[2]
    assert second.startswith('{"city": "R') and not second.endswith("}")
    return max_tokens, second


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


# ---- a call cut at max_tokens is a call, never markup in content --------------------------------


def test_a_forced_call_cut_at_max_tokens_is_a_call_with_its_arguments_as_written(client, policy):
    # the forced text up to the city's opening quote: no row can close the arguments within it
    max_tokens = tokens_to_cut(policy, CALL_PREFIX + "Paris", CALL_PREFIX)
    request = dict(
        model="tiny",
        messages=QUESTION,
        tools=[WEATHER],
        tool_choice="required",
        n=8,
        seed=0,
        max_tokens=max_tokens,
    )
    resp = client.chat.completions.create(**request)
    cut_in_arguments = 0
    for c in resp.choices:
        text = policy.tokenizer.decode(c.token_ids)  # as sampled: a prefix of CALL_PREFIX
        assert CALL_PREFIX.startswith(text) and c.finish_reason == "length"
        assert c.message.content is None  # before: the markup, with no tool_calls
        if '"name": "get_weather"' not in text:  # cut before the name was whole: no call to report
            assert c.message.tool_calls is None
            continue
        written = text.split('"arguments": ', 1)[1] if '"arguments": ' in text else ""
        assert calls_of(c.message) == [("get_weather", written)]
        cut_in_arguments += written != ""
    assert cut_in_arguments >= 1
    # streamed, the same seeded request sends the same calls and no content
    for i, got in streamed(client, **request).items():
        assert got["content"] == "" and got["finish"] == "length"
        assert [tuple(v) for v in got["calls"].values()] == calls_of(resp.choices[i].message)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_block_cut_at_max_tokens_keeps_its_whole_calls_under_auto(two_calls, stream):
    policy, base_url = two_calls
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    max_tokens, second = cut_two_calls(policy)
    request = dict(model="tiny", messages=QUESTION, tools=[SDK_WEATHER], temperature=0, max_tokens=max_tokens)
    want = [("get_weather", '{"city": "Paris"}'), ("get_weather", second)]
    if stream:
        (got,) = streamed(client, **request).values()
        assert got["content"] == "" and got["finish"] == "length"
        assert [tuple(v) for v in got["calls"].values()] == want
    else:
        (c,) = client.chat.completions.create(**request).choices
        assert policy.tokenizer.decode(c.token_ids).endswith(second)  # the taught answer, cut
        # before: content held the whole block's markup and there were no tool_calls
        assert c.message.content is None and c.finish_reason == "length"
        assert calls_of(c.message) == want


def test_the_agents_sdk_gets_the_cut_call_and_reports_its_arguments(two_calls):
    policy, base_url = two_calls
    set_tracing_disabled(True)  # the SDK would send traces to OpenAI's servers
    RAN.clear()
    max_tokens, second = cut_two_calls(policy)
    agent = Agent(
        name="weather",
        tools=[get_weather],
        tool_use_behavior="stop_on_first_tool",
        model=OpenAIChatCompletionsModel(
            model="tiny", openai_client=AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        ),
        model_settings=ModelSettings(tool_choice="required", max_tokens=max_tokens, temperature=0.0),
    )
    result = asyncio.run(Runner.run(agent, QUESTION[0]["content"], max_turns=2))
    # before: the SDK took the raw <tool_call> markup as the agent's final answer
    assert "<tool_call>" not in str(result.final_output)
    calls = [item.raw_item for item in result.new_items if item.type == "tool_call_item"]
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_weather", second),
    ]
    outputs = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    assert RAN == ["Paris"] and outputs[0] == "sunny in Paris"
    # the cut call's arguments are not JSON: the SDK reports the failed call to the model, as for OpenAI's
    assert outputs[1] == "An error occurred while running the tool. Please try again."


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


# ---- grammar limits reached while sampling are 400s naming the field -----------------------------

RECURSIVE = {
    "$defs": {
        "node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}, "required": ["next"]}
    },
    "$ref": "#/$defs/node",
}
"""An object that must always hold another: no finite JSON matches it."""
HUGE_PATTERN = {
    "type": "object",
    "properties": {"s": {"type": "string", "pattern": "^(a{1000}){1000}$"}},
    "required": ["s"],
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("schema", [RECURSIVE, HUGE_PATTERN], ids=["recursive", "pattern"])
@pytest.mark.parametrize("where", ["response_format", "tool"])
def test_a_grammar_that_reaches_a_limit_while_sampling_is_a_400_naming_the_field(
    client, schema, where, stream
):
    if where == "response_format":
        request = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
        param = "response_format.json_schema.schema"
    else:
        request = {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
            "tool_choice": "required",
        }
        param = "tools[0].function.parameters"
    with pytest.raises(
        BadRequestError
    ) as info:  # before: a 500 (or, for the tool, "Pointer '/$defs/node' does not exist")
        resp = client.chat.completions.create(
            model="tiny", messages=QUESTION, max_tokens=32, seed=0, stream=stream, **request
        )
        list(resp) if stream else None
    error = info.value.body
    assert info.value.status_code == 400 and error["param"] == param
    assert error["message"].startswith(
        f"{param} cannot be enforced: the grammar reached a limit while sampling ("
    )
    assert "<state>" not in error["message"]  # llguidance's state dump stays out
    # the server goes on answering
    assert client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=2).choices
