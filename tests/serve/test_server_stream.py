"""Streaming and the sampling parameters through the HTTP API, with the official openai client."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import jsonschema
import pytest
import torch
from fastapi.testclient import TestClient
from openai import BadRequestError, OpenAI

from grooves.policy.transformers import TransformersPolicy
from grooves.scale.policy_server import ThreadedServer
from grooves.serve.app import create_app, inprocess_client

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
HELLO = [{"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TransformersPolicy(str(tiny_model_dir), served_name="tiny")


@pytest.fixture(scope="module")
def app(policy):
    return create_app(policy, max_n=16)


def forward_logits(policy, prompt_ids, token_ids):
    with torch.no_grad():
        return (
            policy.model(input_ids=torch.tensor([prompt_ids + token_ids]))
            .logits[0, len(prompt_ids) - 1 : -1]
            .float()
        )


def collect(chunks):
    """Per choice index: content, tool calls (merged by index), finish_reason, the final chunk's extras, chunk order."""
    out: dict[int, dict] = {}
    order = []
    usage = None
    for chunk in chunks:
        if chunk.usage is not None:
            usage = chunk.usage
        indices = [c.index for c in chunk.choices]
        assert len(indices) == len(set(indices))  # one entry per choice in a chunk
        for c in chunk.choices:
            order.append(c.index)
            got = out.setdefault(
                c.index,
                {"content": "", "calls": {}, "finish": None, "final": None, "role": None, "logprobs": []},
            )
            got["role"] = got["role"] or c.delta.role
            got["content"] += c.delta.content or ""
            for call in c.delta.tool_calls or []:
                slot = got["calls"].setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = slot["id"] or call.id
                slot["name"] += call.function.name or ""
                slot["arguments"] += call.function.arguments or ""
            if c.logprobs is not None:
                got["logprobs"] += c.logprobs.content
            if c.finish_reason is not None:
                got["finish"], got["final"] = c.finish_reason, c
    return out, order, usage


def test_streamed_choices_equal_the_unstreamed_ones_sync_client(policy, app):
    request = {"model": "tiny", "messages": HELLO, "n": 3, "max_tokens": 24, "temperature": 1.0, "seed": 9}
    with ThreadedServer(app) as server:
        client = OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        plain = client.chat.completions.create(**request)
        chunks = list(
            client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True})
        )
    got, order, usage = collect(chunks)
    assert sorted(got) == [0, 1, 2]
    for choice in plain.choices:
        streamed = got[choice.index]
        assert streamed["role"] == "assistant"
        assert streamed["content"] == choice.message.content
        assert streamed["finish"] == choice.finish_reason
        final = streamed["final"]  # grooves' fields ride on each choice's final chunk
        assert final.token_ids == choice.token_ids  # two requests: the tokens exactly, logprobs to rounding
        assert final.sampled_logprobs == pytest.approx(choice.sampled_logprobs, abs=1e-5)
        assert final.prompt_token_ids == choice.prompt_token_ids and final.adapter_version == 0
    assert (
        usage.completion_tokens == plain.usage.completion_tokens
        and usage.prompt_tokens == plain.usage.prompt_tokens
    )
    assert chunks[-1].choices == [] and all(c.usage is None for c in chunks[:-1])
    assert order != sorted(order)  # the three choices' chunks interleave


def test_async_streaming_with_logprobs_and_top_logprobs(policy, app):
    async def go():
        client = inprocess_client(app)
        stream = await client.chat.completions.create(
            model="tiny",
            messages=HELLO,
            max_tokens=12,
            temperature=0.7,
            seed=4,
            stream=True,
            logprobs=True,
            top_logprobs=3,
        )
        return [chunk async for chunk in stream]

    got, _, usage = collect(asyncio.run(go()))
    assert usage is None  # not asked for
    final = got[0]["final"]
    entries = got[0]["logprobs"]
    assert [e.logprob for e in entries] == final.sampled_logprobs  # every token's entry, once, in order
    logits = forward_logits(policy, final.prompt_token_ids, final.token_ids)
    top = torch.log_softmax(logits / 0.7, dim=-1).topk(3, dim=-1)
    for t, entry in enumerate(entries):
        assert [policy.tokenizer.convert_tokens_to_ids(a.token) for a in entry.top_logprobs] == top.indices[
            t
        ].tolist()
        assert (
            max(abs(a.logprob - v) for a, v in zip(entry.top_logprobs, top.values[t].tolist(), strict=True))
            < 1e-4
        )


def test_a_forced_call_streams_as_tool_call_deltas(policy, app):
    async def go():
        client = inprocess_client(app)
        stream = await client.chat.completions.create(
            model="tiny",
            messages=HELLO,
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=80,
            seed=2,
            n=2,
            stream=True,
        )
        return [chunk async for chunk in stream]

    got, _, _ = collect(asyncio.run(go()))
    for streamed in got.values():
        if streamed["finish"] == "length":
            continue  # cut before the call closed: what was written came as content
        assert streamed["finish"] == "tool_calls" and streamed["content"] == ""
        (call,) = streamed["calls"].values()
        assert call["id"].startswith("call_") and call["name"] == "get_weather"
        jsonschema.validate(json.loads(call["arguments"]), WEATHER["function"]["parameters"])


def test_structured_output_through_the_api(policy, app):
    client = TestClient(app)
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    for fmt, check in (
        ({"type": "json_object"}, lambda v: isinstance(v, dict)),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}},
            lambda v: jsonschema.validate(v, schema) is None,
        ),
    ):
        body = {
            "model": "tiny",
            "messages": HELLO,
            "n": 6,
            "max_tokens": 60,
            "seed": 1,
            "response_format": fmt,
        }
        choices = client.post("/v1/chat/completions", json=body).json()["choices"]
        done = [c for c in choices if c["finish_reason"] == "stop"]
        assert len(done) >= 3
        for c in done:
            assert check(json.loads(c["message"]["content"]))
    named = {
        "model": "tiny",
        "messages": HELLO,
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "n": 4,
        "max_tokens": 60,
        "seed": 3,
    }
    for c in client.post("/v1/chat/completions", json=named).json()["choices"]:
        if c["finish_reason"] != "length":
            assert c["finish_reason"] == "tool_calls" and c["message"]["content"] is None
            (call,) = c["message"]["tool_calls"]
            assert call["function"]["name"] == "get_weather"


def test_a_schema_llguidance_cannot_compile_is_a_400_with_its_reason(app):
    async def go():
        return await inprocess_client(app).chat.completions.create(
            model="tiny",
            messages=HELLO,
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "strict": True,
                    "schema": {"type": "array", "uniqueItems": True},
                },
            },
        )

    with pytest.raises(BadRequestError) as info:
        asyncio.run(go())
    error = info.value.body
    assert error["param"] == "response_format.json_schema.schema"
    assert 'Unimplemented keys: ["uniqueItems"]' in error["message"]  # llguidance's own words


def test_a_policy_that_cannot_run_a_grammar_refuses_it_before_sampling(tiny_model_dir):
    """The vLLM backend's case: its engine does not run the grammar masks, so the request is a 400, not a 500."""
    policy = TransformersPolicy(str(tiny_model_dir), served_name="tiny")
    policy.prompts.grammar_unavailable = "model.backend = 'vllm' samples in vLLM's engine"
    client = TestClient(create_app(policy))
    body = {"model": "tiny", "messages": HELLO, "max_tokens": 4}
    for extra, param in (
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": False}, "parallel_tool_calls"),
    ):
        resp = client.post("/v1/chat/completions", json=body | extra)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param
        assert "model.backend = 'vllm'" in resp.json()["error"]["message"]
    assert client.post("/v1/chat/completions", json=body | {"tools": [WEATHER]}).status_code == 200
    assert client.get("/health").json()["sampler"]["batches"] == 1  # only that one reached the sampler


def test_logit_bias_and_penalties_through_the_api(policy, app):
    client = TestClient(app)
    body = {"model": "tiny", "messages": HELLO, "n": 8, "max_tokens": 30, "seed": 5}
    plain = client.post("/v1/chat/completions", json=body).json()["choices"]
    counts: dict[int, int] = {}
    for c in plain:
        for t in c["token_ids"]:
            counts[t] = counts.get(t, 0) + 1
    common = max(counts, key=counts.get)  # the token the model samples most here
    banned = client.post("/v1/chat/completions", json=body | {"logit_bias": {str(common): -100}}).json()[
        "choices"
    ]
    assert counts[common] >= 4 and all(common not in c["token_ids"] for c in banned)
    shaped = client.post(
        "/v1/chat/completions", json=body | {"n": 2, "frequency_penalty": 1.0, "presence_penalty": 0.5}
    ).json()["choices"]
    for c in shaped:
        logits = forward_logits(policy, c["prompt_token_ids"], c["token_ids"])
        seen = torch.zeros(logits.shape[-1])
        for t, tok in enumerate(c["token_ids"]):
            z = logits[t] - seen * 1.0 - (seen > 0).float() * 0.5
            assert abs(float(torch.log_softmax(z, dim=-1)[tok]) - c["sampled_logprobs"][t]) < 1e-4
            seen[tok] += 1


def test_a_stream_whose_client_leaves_frees_its_rows(tiny_model_dir):
    endless = TransformersPolicy(str(tiny_model_dir), served_name="tiny")
    endless.sampler.eos_token_ids = set()  # every row runs to max_tokens unless withdrawn
    app = create_app(endless)
    counters = app.state.scheduler.counters
    n, max_tokens = 8, 6000
    body = json.dumps(
        {"model": "tiny", "messages": HELLO, "n": n, "max_tokens": max_tokens, "stream": True}
    ).encode()
    with ThreadedServer(app) as server:
        host, port = server.base_url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: grooves\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 30
        received = b""
        while b"data: " not in received and time.monotonic() < deadline:
            received += sock.recv(4096)
        assert b"data: " in received  # the stream has started
        while counters.batches < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        sock.close()
        while counters.cancelled_requests < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        after = httpx.post(
            server.base_url + "/v1/chat/completions",
            json={"model": "tiny", "messages": HELLO, "max_tokens": 3},
            timeout=30,
        )
    assert counters.cancelled_requests == 1
    assert counters.cancelled_tokens < n * max_tokens // 10
    assert after.status_code == 200
