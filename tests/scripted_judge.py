"""A scripted OpenAI-compatible judge endpoint served over real HTTP, for the judge tests.

`ScriptedServer` is a FastAPI app run by uvicorn on 127.0.0.1 in a background thread. It answers
`/v1/chat/completions` from a script, in order: a string is returned as the assistant's content,
`Status(500)` is an HTTP error, `Delay(s, text)` answers late (to trigger client timeouts),
`Body(text)` answers 200 with a raw body that is not a chat completion, and a callable computes
any of these from the request body; `fallback` answers once the script is used up. It records every
request it receives and lists `models` at /v1/models.

Like a judge model that follows the requested format, it signs its replies: a reply that is a
JSON object without a "nonce" gets the request's nonce as its first field. `Verbatim(text)`
sends a reply exactly as written (what a judge that ignores the format, or echoes, would send).
The judge, reward and example tests import it from here.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from grooves.judge import JudgeClient, JudgeConfig


@dataclass
class Status:
    code: int


@dataclass
class Delay:
    seconds: float
    text: str


@dataclass
class Body:
    """A 200 answer whose body is `text` with `content_type`, not a chat completion."""

    text: str
    content_type: str = "text/plain"


@dataclass
class Verbatim:
    """A reply sent exactly as written, not signed with the request's nonce."""

    text: str


Reply = str | Status | Delay | Body | Verbatim | Callable[[dict], "Reply"]

_NONCE = re.compile(r'"nonce": "(\w+)"')


def nonce_of(body: dict) -> str:
    """The nonce a judge following the instructions must repeat (from the request's system message)."""
    match = _NONCE.search(body["messages"][0]["content"])
    assert match is not None, "the request carries no nonce"
    return match.group(1)


def sign(text: str, body: dict) -> str:
    """`text` with the request's nonce as first field, when it is one JSON object without one."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return text
    if not isinstance(data, dict) or "nonce" in data:
        return text
    return json.dumps({"nonce": nonce_of(body), **data})


def _words(text: str) -> int:
    return len(text.split())


class ScriptedServer:
    """Serves scripted chat completions on a free local port; `base_url` ends in /v1."""

    def __init__(self, script: list[Reply] | None = None, app: FastAPI | None = None) -> None:
        """`app` serves another ASGI app on the same free port instead of the script (e.g. a stand-in judge)."""
        self.script: list[Reply] = list(script or [])
        self.requests: list[dict] = []
        self.fallback: Callable[[dict], Reply] | None = None
        """Answers every request once the script is used up (None: answer 418)."""
        self.in_flight = 0
        self.max_in_flight = 0
        self.models = ["scripted-judge"]
        """What /v1/models lists."""
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self._complete)
        self.app.get("/v1/models")(self._models)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._server = uvicorn.Server(uvicorn.Config(app or self.app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    async def _complete(self, request: Request):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _models(self):
        return {
            "object": "list",
            "data": [{"id": m, "object": "model", "created": 0, "owned_by": "test"} for m in self.models],
        }

    async def _answer(self, request: Request):
        body = await request.json()
        self.requests.append(body)
        if not self.script and self.fallback is not None:
            self.script.append(self.fallback)
        if not self.script:
            return JSONResponse({"error": {"message": "script exhausted"}}, status_code=418)
        step = self.script.pop(0)
        if callable(step):  # computed from the request; it may answer with any kind of step
            step = step(body)
        if isinstance(step, Status):
            return JSONResponse({"error": {"message": f"scripted {step.code}"}}, status_code=step.code)
        if isinstance(step, Body):
            return Response(step.text, media_type=step.content_type)
        if isinstance(step, Delay):
            await asyncio.sleep(step.seconds)
            step = step.text
        text = step.text if isinstance(step, Verbatim) else sign(step, body)
        prompt = sum(_words(m.get("content") or "") for m in body["messages"])
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": _words(text),
                "total_tokens": prompt + _words(text),
            },
        }

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("scripted server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


_RESPONSE = re.compile(r'<response id="(t\d+)">\n(.*?)\n</response>', re.DOTALL)


def shown_responses(body: dict) -> dict[str, str]:
    """id -> rendered response text, as the judge saw them in a group request."""
    return dict(_RESPONSE.findall(body["messages"][1]["content"]))


def group_reply(scores: dict[str, float], criterion: str = "overall") -> str:
    return json.dumps(
        {
            "scores": [
                {"id": i, "reason": f"scored {s}", "criteria": {criterion: s}} for i, s in scores.items()
            ]
        }
    )


def make_client(server: ScriptedServer, tmp_path, sleeps: list[float] | None = None, **config) -> JudgeClient:
    async def record_sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)

    settings = {
        "base_url": server.base_url,
        "model": "scripted-judge",
        "cache_path": tmp_path / "cache.sqlite",
        "backoff_s": 0.01,
        "jitter": 0.0,
    } | config
    cfg = JudgeConfig(**settings)
    return JudgeClient(cfg, sleep=record_sleep)
