"""`grooves serve --backend vllm` on the real engine (vLLM's CPU build), driven by the openai client:
token ids and logprobs, plain and streamed, n > 1, seeds, tool calls, JSON schemas; and the settings
vLLM cannot start with, refused in one line before anything loads."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch

pytest.importorskip("vllm")

from openai import OpenAI  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from grooves.cli import app as cli_app  # noqa: E402
from grooves.policy.transformers import load_model  # noqa: E402
from tiny_models import build_tiny_model_dir  # noqa: E402

pytestmark = pytest.mark.vllm

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
HELLO = [{"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("vllm-serve"), hidden_size=128, init_std=0.2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def adapter(model_dir, tmp_path_factory):
    """A rank-4 adapter of the tiny model with random B, saved by peft: the served model's own."""
    from grooves.config import LoraConfig

    model, _ = load_model(str(model_dir), lora=LoraConfig(rank=4, alpha=8))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    folder = tmp_path_factory.mktemp("own-adapter")
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def server(model_dir, adapter, tmp_path_factory):
    """`grooves serve --backend vllm --adapter ADAPTER` in its own process group; yields its /v1 URL."""
    port = _free_port()
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grooves", "serve", "--backend", "vllm", "--model", str(model_dir)]
            + ["--adapter", str(adapter), "--served-name", "tiny", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 480
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(base + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start in 8 minutes"
            time.sleep(1)
        yield base + "/v1"
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, then SIGKILL to what is left of it: vLLM's engine
    process can outlive its server."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the whole group has exited
            return
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture(scope="module")
def served_model(model_dir, adapter):
    """The served weights in transformers: the base with the adapter."""
    return load_model(str(model_dir), adapter_path=adapter)[0]


def forward_logprobs(model, prompt, tokens, temperature=1.0):
    ids = torch.tensor([prompt + tokens])  # [1, P+T]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()  # [P+T, V]
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)  # [T, V]
    return logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


def test_samples_carry_ids_and_logprobs_of_the_served_model_and_seeds_repeat(server, served_model, model_dir):
    client = OpenAI(base_url=server, api_key="x")
    ask = dict(model="tiny", messages=HELLO, n=4, max_tokens=16, temperature=0.8, seed=7, logprobs=True)
    first, again = client.chat.completions.create(**ask), client.chat.completions.create(**ask)
    ids = [c.model_extra["token_ids"] for c in first.choices]
    assert len(ids) == 4 and len({tuple(i) for i in ids}) > 1  # n samples, not one sample n times
    assert [c.model_extra["token_ids"] for c in again.choices] == ids  # the same seed, the same samples
    for c in first.choices:
        extra = c.model_extra
        expected = forward_logprobs(served_model, extra["prompt_token_ids"], extra["token_ids"], 0.8)
        assert (torch.tensor(extra["sampled_logprobs"]) - expected).abs().max().item() < 1e-4
        assert [t.logprob for t in c.logprobs.content] == pytest.approx(extra["sampled_logprobs"])
        assert extra["adapter_version"] == 0 and extra["adapter_id"] is None
    base = load_model(str(model_dir))[0]  # the adapter is applied: the base alone gives other logprobs
    extra = first.choices[0].model_extra
    without = forward_logprobs(base, extra["prompt_token_ids"], extra["token_ids"], 0.8)
    assert (torch.tensor(extra["sampled_logprobs"]) - without).abs().max().item() > 0.01
    other = client.chat.completions.create(**(ask | {"seed": 8}))
    assert [c.model_extra["token_ids"] for c in other.choices] != ids


def test_a_streamed_request_gives_the_plain_requests_samples(server):
    client = OpenAI(base_url=server, api_key="x")
    ask = dict(model="tiny", messages=HELLO, n=2, max_tokens=12, seed=3)
    plain = client.chat.completions.create(**ask)
    content, final = {0: "", 1: ""}, {}
    for chunk in client.chat.completions.create(**ask, stream=True):
        for choice in chunk.choices:
            content[choice.index] += choice.delta.content or ""
            if choice.finish_reason is not None:
                final[choice.index] = (choice.finish_reason, choice.model_extra["token_ids"])
    for c in plain.choices:
        assert content[c.index] == c.message.content
        assert final[c.index] == (c.finish_reason, c.model_extra["token_ids"])


def test_tool_calls_and_json_schemas_are_enforced_and_parsed(server):
    client = OpenAI(base_url=server, api_key="x")
    forced = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "weather in Paris?"}],
        n=2,
        max_tokens=60,
        seed=1,
        tools=[WEATHER],
        tool_choice="required",
    )
    for c in forced.choices:
        assert c.finish_reason == "tool_calls"
        assert [t.function.name for t in c.message.tool_calls] and all(
            set(json.loads(t.function.arguments)) == {"city"} for t in c.message.tool_calls
        )
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    shaped = client.chat.completions.create(
        model="tiny",
        messages=HELLO,
        max_tokens=40,
        seed=2,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    )
    assert shaped.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(shaped.choices[0].message.content)["ok"], bool)


def test_settings_vllm_cannot_start_with_fail_in_one_line_before_loading(model_dir, tmp_path):
    sleepy = tmp_path / "run.toml"
    sleepy.write_text(
        f'task = "toy_tokens"\noutput_dir = "{tmp_path / "run"}"\n[model]\nbase_model = "{model_dir}"\n'
        'backend = "vllm"\n[vllm]\nsleep_level = 1\n'
    )
    done = CliRunner().invoke(cli_app, ["train", str(sleepy)])
    assert done.exit_code == 2 and done.stderr == (
        f"{sleepy}: vllm.sleep_level = 1: vLLM's CPU build has no sleep mode; set it to 0 (the engine stays resident)\n"
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()

    narrow = build_tiny_model_dir(tmp_path / "narrow")  # 8-dimensional heads
    done = CliRunner().invoke(cli_app, ["serve", "--backend", "vllm", "--model", str(narrow)])
    assert done.exit_code == 1 and done.stderr == (
        "error: model.base_model: its attention heads have 8 dimensions, and vLLM's CPU build has kernels for "
        "32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512; use model.backend = 'transformers' for this model\n"
    )
    done = CliRunner().invoke(
        cli_app, ["serve", "--backend", "vllm", "--model", str(model_dir), "--dtype", "float64"]
    )
    assert done.exit_code == 1 and done.stderr == (
        "error: model.dtype = 'float64': vLLM's CPU build runs bfloat16, float16, float32; pick one of them\n"
    )


def test_responses_and_token_in_generation_run_on_the_engine(server, served_model):
    """`/v1/responses` and `/inference/v1/generate` go through the same scheduler, so the engine samples them."""
    client = OpenAI(base_url=server, api_key="x")
    r = client.responses.create(
        model="tiny", input="hello world", max_output_tokens=8, include=["message.output_text.logprobs"]
    )
    extra = r.model_extra
    expected = forward_logprobs(served_model, extra["prompt_token_ids"], extra["token_ids"])
    assert (torch.tensor(extra["sampled_logprobs"]) - expected).abs().max().item() < 1e-4
    assert [lp.logprob for lp in r.output[0].content[0].logprobs] == pytest.approx(extra["sampled_logprobs"])
    root = server.removesuffix("/v1")
    body = {
        "model": "tiny",
        "token_ids": extra["prompt_token_ids"],
        "sampling_params": {"max_tokens": 6, "logprobs": 0},
    }
    out = httpx.post(root + "/inference/v1/generate", json=body, timeout=120).json()
    (choice,) = out["choices"]
    got = [e["logprob"] for e in choice["logprobs"]["content"]]
    expected = forward_logprobs(served_model, extra["prompt_token_ids"], choice["token_ids"])
    assert len(got) == len(choice["token_ids"]) == 6 and choice["adapter_version"] == 0
    assert (torch.tensor(got) - expected).abs().max().item() < 1e-4
