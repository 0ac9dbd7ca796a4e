"""The judge client against a scripted endpoint (`scripted_judge.ScriptedServer`): retries, timeouts, limits, errors."""

from __future__ import annotations

import asyncio
import re

import pytest

from grooves.judge import JudgeConfig, JudgeError
from scripted_judge import Body, Delay, ScriptedServer, Status, make_client


@pytest.fixture
def server():
    with ScriptedServer() as s:
        yield s


def test_server_answers_in_order_and_counts_requests(server, tmp_path):
    server.script += ["first", "second"]

    async def go():
        client = make_client(server, tmp_path)
        a = await client.complete([{"role": "user", "content": "one two three"}])
        b = await client.complete([{"role": "user", "content": "x"}])
        await client.aclose()
        return a, b, client.usage

    a, b, usage = asyncio.run(go())
    assert (a.text, b.text) == ("first", "second")
    assert len(server.requests) == 2
    assert server.requests[0]["model"] == "scripted-judge"
    assert (usage.requests, usage.prompt_tokens, usage.completion_tokens) == (2, 4, 2)


def test_retries_http_500_with_exponential_backoff(server, tmp_path):
    server.script += [Status(500), Status(503), "ok"]
    sleeps: list[float] = []

    async def go():
        client = make_client(server, tmp_path, sleeps)
        out = await client.complete([{"role": "user", "content": "hi"}])
        await client.aclose()
        return out, client.usage

    out, usage = asyncio.run(go())
    assert out.text == "ok"
    assert len(server.requests) == 3
    assert sleeps == [0.01, 0.02]  # backoff_s * 2**k
    assert (usage.requests, usage.retries) == (3, 2)


def test_retries_a_timeout_then_succeeds(server, tmp_path):
    server.script += [Delay(2.0, "too late"), "in time"]
    sleeps: list[float] = []

    async def go():
        client = make_client(server, tmp_path, sleeps, timeout_s=0.3)
        out = await client.complete([{"role": "user", "content": "hi"}])
        await client.aclose()
        return out

    assert asyncio.run(go()).text == "in time"
    assert sleeps == [0.01]


def test_gives_up_after_max_retries_with_a_clear_error(server, tmp_path):
    server.script += [Status(500)] * 3

    async def go():
        client = make_client(server, tmp_path, max_retries=2)
        try:
            await client.complete([{"role": "user", "content": "hi"}])
        finally:
            await client.aclose()

    with pytest.raises(JudgeError, match="failed after 3 attempts"):
        asyncio.run(go())
    assert len(server.requests) == 3


def test_client_errors_are_not_retried(server, tmp_path):
    server.script += [Status(400), "never reached"]

    async def go():
        client = make_client(server, tmp_path)
        try:
            await client.complete([{"role": "user", "content": "hi"}])
        finally:
            await client.aclose()

    with pytest.raises(JudgeError, match="failed: "):
        asyncio.run(go())
    assert len(server.requests) == 1


def test_concurrency_limit_holds_requests_back(server, tmp_path):
    server.script += [Delay(0.1, "done")] * 6

    async def go():
        client = make_client(server, tmp_path, concurrency=2)
        await asyncio.gather(*(client.complete([{"role": "user", "content": str(i)}]) for i in range(6)))
        await client.aclose()

    asyncio.run(go())
    assert len(server.requests) == 6
    assert server.max_in_flight == 2


def test_missing_endpoint_settings_name_the_env_vars(monkeypatch, tmp_path):
    monkeypatch.delenv("GROOVES_JUDGE_BASE_URL", raising=False)
    monkeypatch.delenv("GROOVES_JUDGE_MODEL", raising=False)
    with pytest.raises(JudgeError, match="GROOVES_JUDGE_BASE_URL"):
        JudgeConfig(model="m", cache_path=None).resolved()
    monkeypatch.setenv("GROOVES_JUDGE_BASE_URL", "http://127.0.0.1:1/v1")
    with pytest.raises(JudgeError, match="GROOVES_JUDGE_MODEL"):
        JudgeConfig(cache_path=None).resolved()
    monkeypatch.setenv("GROOVES_JUDGE_MODEL", "from-env")
    cfg = JudgeConfig(cache_path=None).resolved()
    assert (cfg.base_url, cfg.model, cfg.api_key) == ("http://127.0.0.1:1/v1", "from-env", "none")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            Body("<html>upstream busy</html>"),
            "answered with a body that is not a chat completion: '<html>upstream busy</html>'",
        ),
        (Body("{not json", "application/json"), "answered with a body that is not JSON"),
        (
            Body('{"object": "error"}', "application/json"),
            "answered with a body that is not a chat completion",
        ),
    ],
    ids=["text", "broken JSON", "JSON without choices"],
)
def test_a_200_that_is_not_a_chat_completion_is_a_judge_error(server, tmp_path, body, message):
    server.script += [body, "never reached"]

    async def go():
        client = make_client(server, tmp_path)
        try:
            await client.complete([{"role": "user", "content": "hi"}])
        finally:
            await client.aclose()

    with pytest.raises(JudgeError) as err:
        asyncio.run(go())
    assert message in str(err.value)
    assert len(server.requests) == 1  # not retried: the endpoint answered, with something else


def test_check_finds_the_model_and_names_what_is_served(server, tmp_path):
    server.models = ["judge-a", "judge-b"]

    async def check(**config):
        client = make_client(server, tmp_path, **config)
        try:
            return await client.check()
        finally:
            await client.aclose()

    assert asyncio.run(check(model="judge-b")) == ["judge-a", "judge-b"]
    with pytest.raises(
        JudgeError, match=r"does not serve model 'scripted-judge'; it serves: judge-a, judge-b"
    ):
        asyncio.run(check())
    root = server.base_url.removesuffix("/v1")
    with pytest.raises(
        JudgeError,
        match=rf"answered 404 \(not found\); OpenAI-compatible servers answer under /v1: "
        rf"try --base-url {re.escape(root)}/v1",
    ):
        asyncio.run(check(base_url=root))
    with pytest.raises(
        JudgeError, match="cannot reach the judge at http://127.0.0.1:9/v1/.*Is the server running"
    ):
        asyncio.run(check(base_url="http://127.0.0.1:9/v1"))
    assert server.requests == []  # the check never asks for a completion
