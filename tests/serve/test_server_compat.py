"""docs/serving.md's compatibility tables agree with the code, cover OpenAI's fields, and the server does what they say."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from openai.types.chat import ChatCompletion, ChatCompletionMessage, completion_create_params
from openai.types.chat.chat_completion import Choice

from grooves.policy.transformers import TransformersPolicy
from grooves.serve.app import create_app
from grooves.serve.compat import REQUEST_FIELDS, RESPONSE_FIELDS
from grooves.serve.schemas import ChatRequest

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
BASE = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


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
