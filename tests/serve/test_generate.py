"""Token-in generation (`POST /inference/v1/generate`, vLLM's shape) and vLLM's token fields on chat.

The route is driven by the client token-aware trainers use (`renderers.client.generate`, verifiers'
and prime-rl's) where it is installed, and by plain HTTP otherwise.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from openai import OpenAI

from grooves.policy.transformers import TransformersPolicy
from grooves.scale.policy_server import ThreadedServer
from grooves.serve.app import create_app
from grooves.training_service.app import create_service_app


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TransformersPolicy(str(tiny_model_dir), served_name="tiny")


@pytest.fixture(scope="module")
def http(policy):
    return TestClient(create_app(policy))


def test_the_prompt_ids_are_continued_exactly_with_logprobs(policy, http):
    prompt = policy.prompts.render([{"role": "user", "content": "hi"}], None)
    body = {
        "model": "tiny",
        "token_ids": prompt,
        "sampling_params": {"max_tokens": 5, "temperature": 1.0, "seed": 7, "logprobs": 2, "n": 2},
    }
    out = http.post("/inference/v1/generate", json=body).json()
    assert out["prompt_token_ids"] == prompt and out["usage"]["prompt_tokens"] == len(prompt)
    assert [c["index"] for c in out["choices"]] == [0, 1]
    # the same ids, seed and settings through the chat route sample the same tokens with the same logprobs
    chat = http.post(
        "/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5,
            "seed": 7,
            "n": 2,
            "logprobs": True,
        },
    ).json()
    for gen, ref in zip(out["choices"], chat["choices"], strict=True):
        assert gen["token_ids"] == ref["token_ids"] and len(gen["token_ids"]) == 5
        entries = gen["logprobs"]["content"]
        assert [e["token"] for e in entries] == [f"token_id:{t}" for t in gen["token_ids"]]
        assert [e["token_id"] for e in entries] == gen["token_ids"]
        assert [e["logprob"] for e in entries] == pytest.approx(ref["sampled_logprobs"], abs=1e-5)
        assert all(len(e["top_logprobs"]) == 2 for e in entries)
        assert gen["finish_reason"] == "length" and gen["adapter_version"] == 0 and gen["adapter_id"] is None


def test_text_mode_and_no_logprobs(policy, http):
    prompt = policy.prompts.render([{"role": "user", "content": "hi"}], None)
    out = http.post(
        "/inference/v1/generate",
        json={"token_ids": prompt, "output_mode": "text", "sampling_params": {"max_tokens": 4, "seed": 1}},
    ).json()
    (choice,) = out["choices"]
    assert choice["logprobs"] is None and out["model"] == "tiny"  # the model defaults to the served one
    assert choice["text"] == policy.tokenizer.decode(choice["token_ids"], skip_special_tokens=True)


def test_logprobs_zero_gives_the_sampled_tokens_own_entry(policy, http):
    prompt = policy.prompts.render([{"role": "user", "content": "hi"}], None)
    body = {"token_ids": prompt, "sampling_params": {"max_tokens": 4, "seed": 2, "logprobs": 0}}
    (choice,) = http.post("/inference/v1/generate", json=body).json()["choices"]
    entries = choice["logprobs"]["content"]
    assert [e["token_id"] for e in entries] == choice["token_ids"]
    for e in entries:  # vLLM's semantics: no alternatives, the sampled token's own logprob entry
        assert e["top_logprobs"] == [
            {"token": e["token"], "token_id": e["token_id"], "logprob": e["logprob"]}
        ]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"token_ids": []}, "token_ids", "at least 1"),
        ({"token_ids": [10**6]}, "token_ids", "not a token id"),
        ({"token_ids": [5], "sampling_params": {"top_k": 5}}, "sampling_params.top_k", "not supported"),
        ({"token_ids": [5], "sampling_params": {"top_k": -1, "min_p": 0.0}}, None, None),
        ({"token_ids": [5], "sampling_params": {"nonsense": 1}}, "sampling_params.nonsense", "remove it"),
        (
            {"token_ids": [5], "sampling_params": {"stop_token_ids": [7]}},
            "sampling_params.stop_token_ids",
            "[7]",
        ),
        ({"token_ids": [5], "features": {"mm_hashes": {}}}, "features", "not supported"),
        ({"token_ids": [5], "stream": True}, "stream", "stream: false"),
        ({"token_ids": [5], "sampling_params": {"max_tokens": 10**6}}, "sampling_params.max_tokens", "limit"),
        ({"token_ids": [5], "model": "other"}, "model", "not served"),
        # strict JSON types, as on chat: `true` and "0.5" are not numbers
        (
            {"token_ids": [5], "sampling_params": {"temperature": True}},
            "sampling_params.temperature",
            "number",
        ),
        (
            {"token_ids": [5], "sampling_params": {"temperature": "0.5"}},
            "sampling_params.temperature",
            "number",
        ),
        ({"token_ids": [5], "sampling_params": {"top_p": True}}, "sampling_params.top_p", "number"),
        (
            {"token_ids": [5], "sampling_params": {"presence_penalty": "1"}},
            "sampling_params.presence_penalty",
            "number",
        ),
        (
            {"token_ids": [5], "sampling_params": {"frequency_penalty": False}},
            "sampling_params.frequency_penalty",
            "number",
        ),
        (
            {"token_ids": [5], "sampling_params": {"logit_bias": {"5": True}}},
            "sampling_params.logit_bias.5",
            "number",
        ),
    ],
)
def test_bad_input_is_one_error_naming_it(http, body, param, words):
    resp = http.post("/inference/v1/generate", json={"sampling_params": {"max_tokens": 2}} | body)
    if param is None:
        assert resp.status_code == 200
        return
    error = resp.json()["error"]
    assert resp.status_code in (400, 404) and error["param"] == param and words in error["message"], error


def test_the_training_service_samples_a_trainable_models_live_adapter(tmp_path, tiny_model_dir):
    app = create_service_app(tmp_path / "svc", str(tiny_model_dir), served_name="tiny")
    try:
        http = TestClient(app)
        created = http.post("/v1/trainable_models", json={"name": "m1", "config": {"lora": {"rank": 4}}})
        assert created.status_code == 201, created.text
        prompt = app.state.service.policy.prompts.render([{"role": "user", "content": "hi"}], None)
        out = http.post(
            "/inference/v1/generate",
            json={"model": "m1", "token_ids": prompt, "sampling_params": {"max_tokens": 3, "logprobs": 0}},
        ).json()
        (choice,) = out["choices"]
        assert choice["adapter_version"] == 0 and choice["adapter_id"] is not None
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"]) == 3
    finally:
        app.state.scheduler.close()
        app.state.service.close()


def test_vllm_token_fields_on_chat(policy):
    with ThreadedServer(create_app(policy)) as s:
        client = OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": "hi"}]
        r = client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=4,
            logprobs=True,
            extra_body={
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
                "skip_special_tokens": True,
            },
        )
        (choice,) = r.choices
        assert r.model_extra["prompt_token_ids"] == policy.prompts.render(messages, None)
        ids = choice.model_extra["token_ids"]
        assert [e.token for e in choice.logprobs.content] == [f"token_id:{t}" for t in ids]
        assert all(math.isfinite(e.logprob) for e in choice.logprobs.content)
        stream = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=4, stream=True, extra_body={"return_token_ids": True}
        )
        chunks = list(stream)
        assert chunks[0].model_extra["prompt_token_ids"] == r.model_extra["prompt_token_ids"]
        assert all("prompt_token_ids" not in (c.model_extra or {}) for c in chunks[1:])


def test_skip_special_tokens_false_keeps_them_in_the_content(policy):
    http = TestClient(create_app(policy))
    special = policy.tokenizer.convert_tokens_to_ids("<|im_start|>")
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "logit_bias": {str(special): 100},  # the model writes the special token
        "skip_special_tokens": False,
    }
    kept = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    assert kept == "<|im_start|>" * 3
    dropped = http.post("/v1/chat/completions", json=body | {"skip_special_tokens": True}).json()
    assert dropped["choices"][0]["message"]["content"] == ""
    streamed = http.post("/v1/chat/completions", json=body | {"stream": True})
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "skip_special_tokens"


VERIFIERS_PYTHON = Path(__file__).resolve().parents[2] / ".venv-verifiers" / "bin" / "python"
RENDERERS_CALL = """
import asyncio, json, sys
from openai import AsyncOpenAI
from renderers import create_renderer
from renderers.base import load_tokenizer
from renderers.client import generate

async def main():
    renderer = create_renderer(load_tokenizer(sys.argv[2]), None)
    out = await generate(client=AsyncOpenAI(base_url=sys.argv[1], api_key="x"), renderer=renderer,
                         messages=[{"role": "user", "content": "hi"}], model="tiny",
                         sampling_params={"max_tokens": 4, "seed": 3})
    print(json.dumps({k: out[k] for k in ("prompt_ids", "completion_ids", "completion_logprobs", "finish_reason")}))

asyncio.run(main())
"""


@pytest.mark.verifiers
@pytest.mark.skipif(not VERIFIERS_PYTHON.exists(), reason="needs .venv-verifiers: make setup-verifiers")
def test_the_renderers_client_of_verifiers_reads_the_answer(policy, tiny_model_dir):
    """`renderers.client.generate` (verifiers' `TrainClient` calls it), unchanged, in its own virtualenv."""
    with ThreadedServer(create_app(policy)) as s:
        run = subprocess.run(
            [str(VERIFIERS_PYTHON), "-c", RENDERERS_CALL, s.base_url + "/v1", str(tiny_model_dir)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    assert out["prompt_ids"] == policy.prompts.render([{"role": "user", "content": "hi"}], None)
    assert (
        len(out["completion_ids"]) == len(out["completion_logprobs"]) == 4
        and out["finish_reason"] == "length"
    )
    with TestClient(create_app(policy)) as http:
        ref = http.post(
            "/inference/v1/generate",
            json={
                "token_ids": out["prompt_ids"],
                "sampling_params": {"max_tokens": 4, "seed": 3, "logprobs": 0},
            },
        ).json()["choices"][0]
    assert ref["token_ids"] == out["completion_ids"]
    assert [e["logprob"] for e in ref["logprobs"]["content"]] == pytest.approx(
        out["completion_logprobs"], abs=1e-5
    )
