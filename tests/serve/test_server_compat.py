"""docs/serving.md's compatibility tables agree with the code, cover OpenAI's fields, and the server does what they say."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from openai import BadRequestError, OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionMessage, completion_create_params
from openai.types.chat.chat_completion import Choice

from grooves.policy.transformers import TransformersPolicy
from grooves.serve.app import create_app
from grooves.serve.compat import REQUEST_FIELDS, RESPONSE_FIELDS
from grooves.serve.schemas import ChatRequest

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
BASE = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
HI = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
}
SCHEMA = {"name": "x", "schema": {"type": "object", "properties": {}}}


def doc_table(title: str) -> dict[str, str]:
    text = DOC.read_text()
    body = text.split(f"### {title}\n", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| (\w+) \|", body, flags=re.M)
    assert rows, f"no table under '### {title}' in {DOC}"
    return dict(rows)


def test_the_doc_tables_are_the_codes():
    assert doc_table("Request fields") == {k: v.status for k, v in REQUEST_FIELDS.items()}
    assert doc_table("Response fields") == {k: v.status for k, v in RESPONSE_FIELDS.items()}


def test_the_tables_cover_every_field_the_openai_client_knows():
    request = set(typing.get_type_hints(completion_create_params.CompletionCreateParamsBase)) | {"stream"}
    assert request - set(REQUEST_FIELDS) == set()
    response = set(ChatCompletion.model_fields) - {"choices"}
    response |= {f"choices[].{f}" for f in Choice.model_fields if f != "message"}
    response |= {f"choices[].message.{f}" for f in ChatCompletionMessage.model_fields}
    assert response - set(RESPONSE_FIELDS) == set()


def test_supported_request_fields_are_read_by_the_request_model():
    for name, support in REQUEST_FIELDS.items():
        assert (name in ChatRequest.model_fields) == (support.status != "refused"), name


@pytest.fixture(scope="module")
def client(tiny_model_dir):
    return TestClient(create_app(TransformersPolicy(str(tiny_model_dir), served_name="tiny")))


@pytest.mark.parametrize("name", [k for k, v in REQUEST_FIELDS.items() if v.status == "refused"])
def test_each_refused_field_is_a_400_naming_it_and_its_inert_values_pass(client, name):
    resp = client.post("/v1/chat/completions", json={**BASE, name: "something"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == name
    for inert in REQUEST_FIELDS[name].inert:
        assert client.post("/v1/chat/completions", json={**BASE, name: inert}).status_code == 200


def test_a_response_sends_exactly_the_supported_fields(client):
    body = client.post("/v1/chat/completions", json={**BASE, "logprobs": True, "top_logprobs": 2}).json()
    sent = {k for k in body if k != "choices"}
    sent |= {f"choices[].{k}" for k in body["choices"][0] if k != "message"}
    sent |= {f"choices[].message.{k}" for k in body["choices"][0]["message"]}
    documented = {k for k, v in RESPONSE_FIELDS.items() if v.status != "refused"}
    assert sent - documented == set()  # nothing undocumented
    assert documented - sent <= {
        "choices[].message.tool_calls",
        "prompt_token_ids",
    }  # sent when there are calls, when asked
    assert {k for k, v in RESPONSE_FIELDS.items() if v.status == "refused"} & sent == set()


NESTED = {  # a field inside an object: refused naming its path, however deep
    "message extra": (
        {"messages": [HI | {"cache_control": {"type": "ephemeral"}}]},
        "messages[0].cache_control",
    ),
    "part extra": (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {}}]}]},
        "messages[0].content[0].cache_control",
    ),
    "part cache breakpoint": (
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi", "prompt_cache_breakpoint": {}}]}
            ]
        },
        "messages[0].content[0].prompt_cache_breakpoint",
    ),
    "refusal sent back": (
        {"messages": [HI, {"role": "assistant", "content": "no", "refusal": "no"}, HI]},
        "messages[1].refusal",
    ),
    "call function extra": (
        {
            "messages": [
                HI,
                CALLED
                | {
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}", "strict": True},
                        }
                    ]
                },
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ]
        },
        "messages[1].tool_calls[0].function.strict",
    ),
    "call extra": (
        {
            "messages": [
                HI,
                CALLED | {"tool_calls": [CALLED["tool_calls"][0] | {"index": 0}]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ]
        },
        "messages[1].tool_calls[0].index",
    ),
    "tool extra": ({"tools": [TOOL | {"defer_loading": True}]}, "tools[0].defer_loading"),
    "function extra": (
        {"tools": [{"type": "function", "function": TOOL["function"] | {"output_schema": {}}}]},
        "tools[0].function.output_schema",
    ),
    "tool_choice extra": (
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f", "arguments": "{}"}}},
        "tool_choice.function.arguments",
    ),
    "json_object with a schema": (
        {"response_format": {"type": "json_object", "schema": {"type": "object"}}},
        "response_format.schema",
    ),
    "json_schema extra": (
        {"response_format": {"type": "json_schema", "json_schema": SCHEMA | {"strict_mode": True}}},
        "response_format.json_schema.strict_mode",
    ),
}


@pytest.fixture(scope="module")
def openai_client(client):
    return OpenAI(base_url=str(client.base_url) + "/v1", api_key="x", http_client=client, max_retries=0)


@pytest.mark.parametrize("case", list(NESTED))
def test_a_nested_field_is_refused_naming_its_path(openai_client, case):
    body, param = NESTED[case]
    with pytest.raises(BadRequestError) as caught:
        openai_client.post("/chat/completions", body={**BASE, **body}, cast_to=object)
    error = caught.value.body
    assert error["param"] == param and error["message"].startswith(param), error


def test_a_json_schema_with_a_description_is_answered_in_its_schema(openai_client):
    # LangChain's with_structured_output sends a schema's docstring as json_schema.description
    format_ = {"type": "json_schema", "json_schema": SCHEMA | {"description": "a thing"}}
    done = openai_client.chat.completions.create(
        model="tiny", messages=[HI], max_tokens=40, response_format=format_
    )
    assert done.choices[0].finish_reason in ("stop", "length")


def test_a_message_the_client_read_goes_back_as_it_is(openai_client):
    first = openai_client.chat.completions.create(model="tiny", messages=[HI], max_tokens=3)
    message = first.choices[0].message
    prompts = []
    # the object itself (the client sends the fields it read) and its whole dump (nulls included)
    for sent_back in (message, message.model_dump()):
        again = openai_client.chat.completions.create(
            model="tiny", messages=[HI, sent_back, HI], max_tokens=2
        )
        prompts.append(again.choices[0].model_extra["prompt_token_ids"])
    assert prompts[0] == prompts[1]  # the nulls ask for nothing: the same prompt
