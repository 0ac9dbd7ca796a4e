"""`POST /v1/responses`, driven by the real `openai` client and the OpenAI Agents SDK with its defaults."""

from __future__ import annotations

import asyncio
import json
import re
import typing
from pathlib import Path
from typing import Literal

import pytest
from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from agents.models.openai_provider import OpenAIProvider
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI, BadRequestError, OpenAI
from openai.types.responses import response_create_params
from pydantic import BaseModel

from grooves.policy.transformers import TransformersPolicy
from grooves.scale.policy_server import ThreadedServer
from grooves.serve.app import create_app
from grooves.serve.responses.fields import RESPONSES_FIELDS
from grooves.serve.responses.request import ResponsesRequest

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
    },
}
YES_NO = {
    "format": {
        "type": "json_schema",
        "name": "yes_no",
        "schema": {
            "type": "object",
            "properties": {"answer": {"enum": ["yes", "no"]}},
            "required": ["answer"],
            "additionalProperties": False,
        },
        "strict": True,
    }
}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    policy = TransformersPolicy(str(tiny_model_dir), served_name="tiny")
    with ThreadedServer(create_app(policy)) as s:
        yield s, policy


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server[0].base_url + "/v1", api_key="x", max_retries=0)


def test_a_text_response_carries_its_tokens_and_logprobs(server, client):
    _, policy = server
    r = client.responses.create(
        model="tiny",
        input="hi",
        max_output_tokens=6,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    extra = r.model_extra
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert len(extra["token_ids"]) == 6 and r.usage.output_tokens == 6
    assert r.usage.input_tokens == len(extra["prompt_token_ids"])
    assert extra["prompt_token_ids"] == policy.prompts.render([{"role": "user", "content": "hi"}], None)
    (message,) = r.output
    assert message.type == "message" and r.output_text == policy.tokenizer.decode(extra["token_ids"])
    lps = message.content[0].logprobs
    assert [lp.logprob for lp in lps] == extra["sampled_logprobs"]
    assert all(len(lp.top_logprobs) == 2 for lp in lps)


def test_a_forced_call_and_its_output_continue_the_exact_ids(client):
    first = client.responses.create(
        model="tiny", input="weather?", tools=[WEATHER], tool_choice="required", max_output_tokens=64
    )
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert set(json.loads(call.arguments)) == {"city"}
    done = first.model_extra["prompt_token_ids"] + first.model_extra["token_ids"]
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    items = [{"role": "user", "content": "weather?"}, call.model_dump(exclude_none=True), answer]
    sent_back = client.responses.create(model="tiny", input=items, tools=[WEATHER], max_output_tokens=4)
    assert sent_back.model_extra["prompt_token_ids"][: len(done)] == done
    by_id = client.responses.create(
        model="tiny", previous_response_id=first.id, input=[answer], tools=[WEATHER], max_output_tokens=4
    )
    assert by_id.model_extra["prompt_token_ids"] == sent_back.model_extra["prompt_token_ids"]
    assert by_id.previous_response_id == first.id


def test_text_format_json_schema_goes_through_the_grammar(client):
    r = client.responses.create(model="tiny", input="yes?", text=YES_NO, max_output_tokens=40)
    assert r.status == "completed" and json.loads(r.output_text)["answer"] in ("yes", "no")


def test_a_stream_is_the_events_the_client_assembles(server, client):
    with client.responses.stream(model="tiny", input="yes?", text=YES_NO, max_output_tokens=40) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text and json.loads(text)["answer"] in ("yes", "no")
    assert final.model_extra["token_ids"][-1] in server[1].prompts.eos_token_ids  # it ended its turn


def test_a_streamed_call_is_an_item_with_its_arguments(client):
    with client.responses.stream(
        model="tiny", input="weather?", tools=[WEATHER], tool_choice="required", max_output_tokens=64
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    (call,) = final.output
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ({f"k{i}": "v" for i in range(17)}, "17 keys"),
        ({"k" * 65: "v"}, "65 characters"),
        ({"k": "v" * 513}, "513 characters"),
    ],
    ids=["17 keys", "a long key", "a long value"],
)
def test_metadata_is_held_to_openais_limits(client, metadata, words):
    with pytest.raises(BadRequestError) as caught:
        client.responses.create(model="tiny", input="hi", max_output_tokens=2, metadata=metadata)
    assert caught.value.body["param"] == "metadata" and words in caught.value.body["message"]
    at_the_limits = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    r = client.responses.create(model="tiny", input="hi", max_output_tokens=2, metadata=at_the_limits)
    assert r.metadata == at_the_limits


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_call_cut_at_max_output_tokens_is_incomplete(client, streamed):
    # the grammar writes the call's opening: 16 tokens end inside its arguments, on any machine
    request = {"model": "tiny", "input": "weather?", "tools": [WEATHER], "tool_choice": "required"}
    if streamed:
        with client.responses.stream(**request, max_output_tokens=16) as stream:
            events = list(stream)
        done = [e.item.status for e in events if e.type == "response.output_item.done"]
        assert done == ["incomplete"] and events[-1].type == "response.incomplete"
        r = events[-1].response  # the client's get_final_response() waits for response.completed only
    else:
        r = client.responses.create(**request, max_output_tokens=16)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "incomplete"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "'reasoning'"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
            "'input_image'",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "'item_reference'"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type", "hosted tools"),
        ({"input": "hi", "include": ["file_search_call.results"]}, "include", "file_search_call.results"),
        ({"input": "hi", "previous_response_id": "resp_nope"}, "previous_response_id", "resp_nope"),
        ({"input": "hi", "text": {"verbosity": "low"}}, "text.verbosity", "verbosity"),
        (
            {"input": "hi", "tools": [{**WEATHER, "parameters": {"type": "string"}}]},
            "tools[0].parameters",
            "object schema",
        ),
        ({"input": "hi", "max_output_tokens": 10**6}, "max_output_tokens", "limit"),
        ({"input": "hi", "n": 2}, "n", "not a Responses request field"),
    ],
)
def test_bad_input_is_one_400_naming_it(client, body, param, words):
    with pytest.raises(BadRequestError) as caught:
        client.post("/responses", body={"model": "tiny", **body}, cast_to=object)
    error = caught.value.body
    assert error["param"] == param and words in error["message"]


NESTED = {  # a field inside an object: refused naming its path, however deep
    "tool deferred": ({"tools": [{**WEATHER, "defer_loading": True}]}, "tools[0].defer_loading"),
    "tool callers": (
        {"tools": [{**WEATHER, "allowed_callers": ["programmatic"]}]},
        "tools[0].allowed_callers",
    ),
    "tool output schema": (
        {"tools": [{**WEATHER, "output_schema": {"type": "string"}}]},
        "tools[0].output_schema",
    ),
    "tool async": ({"tools": [{**WEATHER, "async": True}]}, "tools[0].async"),
    "tool typo": ({"tools": [{**WEATHER, "paramters": {}}]}, "tools[0].paramters"),
    "tool_choice extra": (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather", "strict": True}},
        "tool_choice.strict",
    ),
    "json_object with a schema": (
        {"text": {"format": {"type": "json_object", "schema": {"type": "object"}}}},
        "text.format.schema",
    ),
    "message phase": (
        {"input": [{"role": "user", "content": "hi", "phase": "commentary"}]},
        "input[0].phase",
    ),
    "part extra": (
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi", "cache_control": {}}]}]},
        "input[0].content[0].cache_control",
    ),
    "call namespace": (
        {
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "namespace": "ns"},
            ]
        },
        "input[1].namespace",
    ),
    "call output extra": (
        {
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "ok", "priority": 1},
            ]
        },
        "input[2].priority",
    ),
}


@pytest.mark.parametrize("case", list(NESTED))
def test_a_nested_field_is_refused_naming_its_path(client, case):
    body, param = NESTED[case]
    with pytest.raises(BadRequestError) as caught:
        client.post(
            "/responses",
            body={"model": "tiny", "input": "hi", "max_output_tokens": 2, **body},
            cast_to=object,
        )
    error = caught.value.body
    assert error["param"] == param and error["message"].startswith(param), error


def test_nested_fields_at_values_that_ask_for_nothing_pass(client):
    tool = {**WEATHER, "description": "the weather", "strict": None, "defer_loading": False, "async": False}
    tool |= {"allowed_callers": ["direct"], "output_schema": None}
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny", "status": "completed"},
    ]
    r = client.responses.create(model="tiny", input=items, tools=[tool], max_output_tokens=2)
    assert r.object == "response" and r.tools[0].name == "get_weather"


class Verdict(BaseModel):
    answer: Literal["yes", "no"]


def test_the_agents_sdk_with_its_defaults_runs_a_tool_loop(server):
    s, policy = server
    set_tracing_disabled(True)
    ran: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        ran.append(city)
        return f"sunny in {city}"

    set_default_openai_client(AsyncOpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0), False)
    try:
        agent = Agent(
            name="weather",
            instructions="Answer with the weather tool.",
            tools=[get_weather],
            model="tiny",  # a plain name: the SDK's default model class, which speaks the Responses API
            # the random tiny model must be made to call (the SDK then resets tool_choice to auto) and to end
            # its answer: a final output schema does that (the SDK sends it as text.format json_schema)
            model_settings=ModelSettings(tool_choice="required", max_tokens=96, temperature=0),
            output_type=Verdict,
        )
        assert isinstance(agent.model, str)

        async def go(streamed: bool):
            if not streamed:
                return await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
            result = Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=4)
            kinds = [e.type async for e in result.stream_events()]
            assert "raw_response_event" in kinds
            return result

        async def both():  # one event loop: the client's connections belong to it
            runs = []
            for streamed in (False, True):
                before = len(ran)
                runs.append((before, await go(streamed), list(ran)))
            return runs

        for before, result, ran in asyncio.run(both()):
            items = [item.type for item in result.new_items]
            calls = items.count("tool_call_item")  # the random model may call more than once in its turn
            assert calls >= 1 and items == ["tool_call_item"] * calls + ["tool_call_output_item"] * calls + [
                "message_output_item"
            ]
            assert len(ran) == before + calls  # the SDK ran each call the model made
            outputs = [item.output for item in result.new_items[calls : 2 * calls]]
            assert outputs == [f"sunny in {city}" for city in ran[before:]]
            assert result.final_output.answer in ("yes", "no")
            assert type(result.raw_responses[0]).__name__ == "ModelResponse"
        assert type(OpenAIProvider().get_model("tiny")) is OpenAIResponsesModel
    finally:
        set_default_openai_client(AsyncOpenAI(api_key="unused"), False)


def doc_table() -> dict[str, str]:
    body = DOC.read_text().split("### Responses request fields\n", 1)[1].split("\n#", 1)[0]
    return dict(re.findall(r"^\| `([^`]+)` \| (\w+) \|", body, flags=re.M))


def test_the_doc_table_is_the_code_and_covers_the_client():
    assert doc_table() == {k: v.status for k, v in RESPONSES_FIELDS.items()}
    known = set(typing.get_type_hints(response_create_params.ResponseCreateParamsBase)) | {"stream"}
    assert known == set(RESPONSES_FIELDS)
    for name, support in RESPONSES_FIELDS.items():
        assert (name in ResponsesRequest.model_fields) == (support.status != "refused"), name


@pytest.mark.parametrize("name", [k for k, v in RESPONSES_FIELDS.items() if v.status == "refused"])
def test_each_refused_field_is_a_400_and_its_inert_values_pass(client, name):
    base = {"model": "tiny", "input": "hi", "max_output_tokens": 2}
    with pytest.raises(BadRequestError) as caught:
        client.post("/responses", body={**base, name: "something"}, cast_to=object)
    assert caught.value.body["param"] == name
    for inert in RESPONSES_FIELDS[name].inert:
        # answered: the random model may end its turn within the 2 tokens, so either status
        assert client.post("/responses", body={**base, name: inert}, cast_to=object)["object"] == "response"
