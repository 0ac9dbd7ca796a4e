"""The judge client: one OpenAI-compatible chat endpoint, called reliably and accounted for.

Any server that speaks the chat-completions API works the same way: a hosted frontier API, a
local vLLM or ollama, or `grooves serve` itself. The official `openai.AsyncOpenAI` client does the
HTTP; this module adds what a judge inside a training loop needs and the SDK leaves to callers:

- retries with exponential backoff on transient failures (HTTP 5xx and 429, timeouts, refused
  connections), with the SDK's own retries off so there is one retry policy, written down here;
- a per-request timeout;
- a concurrency limit (`asyncio.Semaphore`), because a trainer judges every group of a step at
  once and a local judge server has a fixed number of slots;
- a persistent cache (see `cache.py`) addressed by `key(...)`, which the judges use to store
  validated judgments;
- token usage accumulated per call, read and reset by `take_usage()` so the trainer can log judge
  tokens per step;
- `check()`, which asks `/models` whether the endpoint serves the judge model before any judging,
  so a wrong URL or model is one clear error instead of one failure per item;
- every way a request can fail, including a 200 whose body is not a chat completion, ends in
  `JudgeError`, which callers count and survive.

Settings come from `JudgeConfig` (a run file's `[judge]` table or CLI flags), falling back to the
environment: GROOVES_JUDGE_BASE_URL, GROOVES_JUDGE_API_KEY, GROOVES_JUDGE_MODEL.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import openai
from pydantic import BaseModel, ConfigDict, Field

from grooves.judge.cache import JudgeCache, cache_key
from grooves.judge.errors import JudgeError

ENV_BASE_URL = "GROOVES_JUDGE_BASE_URL"
ENV_API_KEY = "GROOVES_JUDGE_API_KEY"
ENV_MODEL = "GROOVES_JUDGE_MODEL"


def _default_cache_path() -> Path:
    from grooves.models import grooves_home

    return grooves_home() / "judge-cache.sqlite"


class JudgeConfig(BaseModel):
    """Where the judge lives and how hard to try. Unset endpoint fields fall back to the environment."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = None
    """OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 (env GROOVES_JUDGE_BASE_URL)."""
    api_key: str | None = None
    """API key (env GROOVES_JUDGE_API_KEY); local servers ignore it, so it defaults to "none"."""
    model: str | None = None
    """Judge model name as the endpoint knows it (env GROOVES_JUDGE_MODEL). Part of every cache key."""
    timeout_s: float = Field(default=60.0, gt=0)
    """Per-request timeout. Too short and long group prompts time out; too long and a hung server
    stalls the whole step."""
    max_retries: int = Field(default=3, ge=0)
    """Retries after the first attempt on transient errors (5xx, 429, timeout, connection)."""
    backoff_s: float = Field(default=1.0, ge=0)
    """First retry delay; attempt k waits backoff_s * 2**k, capped at backoff_max_s."""
    backoff_max_s: float = Field(default=30.0, ge=0)
    jitter: float = Field(default=0.1, ge=0, le=1)
    """Random extra fraction of each delay, so concurrent retries do not hit the server in lockstep."""
    concurrency: int = Field(default=8, ge=1)
    """Requests in flight at once. Match the judge server's slots; more only queues there."""
    temperature: float = Field(default=0.0, ge=0)
    """0 makes judgments repeatable (and the cache exact); raise it only to sample several judgments."""
    max_tokens: int = Field(default=1024, ge=16)
    """Room for N reasons plus the JSON; a reply cut off here is invalid JSON and is repaired once."""
    json_mode: bool = False
    """Send response_format={"type": "json_object"}; only for servers that support it."""
    cache_path: Path | None = Field(default_factory=_default_cache_path)
    """SQLite cache file (default $GROOVES_HOME/judge-cache.sqlite); None turns caching off."""

    def resolved(self, *, need_base_url: bool = True) -> JudgeConfig:
        """A copy with base_url / api_key / model filled from the environment; errors say how to set them."""
        base_url = self.base_url or os.environ.get(ENV_BASE_URL)
        model = self.model or os.environ.get(ENV_MODEL)
        api_key = self.api_key or os.environ.get(ENV_API_KEY) or "none"
        if not base_url and need_base_url:
            raise JudgeError(
                f"judge base_url is not set: pass --base-url, set judge.base_url, or export {ENV_BASE_URL}"
            )
        if not model:
            raise JudgeError(f"judge model is not set: pass --model, set judge.model, or export {ENV_MODEL}")
        return self.model_copy(update={"base_url": base_url, "model": model, "api_key": api_key})


@dataclass
class TokenUsage:
    """Judge cost counters; `judge_*` metric names say exactly what is counted."""

    requests: int = 0
    """HTTP requests sent, retries included."""
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_hits: int = 0

    def add(self, other: TokenUsage) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def metrics(self) -> dict[str, float]:
        """As trainer metrics: judge_requests, judge_retries, judge_prompt_tokens, ..."""
        return {f"judge_{f.name}": float(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int


def backoff_delay(attempt: int, base_s: float, max_s: float, jitter: float, u: float) -> float:
    """Delay before retry `attempt` (0-based): min(max_s, base_s * 2**attempt) * (1 + jitter * u), u in [0, 1).

    >>> [backoff_delay(k, 0.5, 3.0, 0.0, 0.0) for k in range(4)]
    [0.5, 1.0, 2.0, 3.0]
    """
    return min(max_s, base_s * (2.0**attempt)) * (1.0 + jitter * u)


def _url_hint(endpoint: str) -> str:
    """What to try when a path is not found: most OpenAI-compatible servers answer under /v1."""
    if endpoint.rstrip("/").endswith("/v1"):
        return ""
    return f"; OpenAI-compatible servers answer under /v1: try --base-url {endpoint.rstrip('/')}/v1"


def _is_transient(exc: Exception) -> bool:
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code >= 500 or exc.status_code in (408, 409, 429)
    return False


Sleep = Callable[[float], Awaitable[Any]]


class JudgeClient:
    """Chat completions against one judge endpoint, with retries, a limit, a cache and usage counts.

    `openai_client` lets an existing `AsyncOpenAI` carry the requests, e.g. `grooves.serve`'s
    `inprocess_client(policy)` for a judge served in this process; the code path is the same.
    Use one client inside one event loop (its semaphore and HTTP pool belong to that loop).
    """

    def __init__(
        self,
        config: JudgeConfig,
        *,
        openai_client: openai.AsyncOpenAI | None = None,
        sleep: Sleep = asyncio.sleep,
        seed: int = 0,
    ) -> None:
        self.config = config.resolved(need_base_url=openai_client is None)
        self.model: str = self.config.model or ""
        self._owns_http = openai_client is None
        if openai_client is None:
            openai_client = openai.AsyncOpenAI(base_url=self.config.base_url, api_key=self.config.api_key)
        # one retry policy, ours; one timeout, the config's
        self._openai = openai_client.with_options(timeout=self.config.timeout_s, max_retries=0)
        self.endpoint = str(self._openai.base_url)
        self._sem = asyncio.Semaphore(self.config.concurrency)
        self._sleep = sleep
        self._rng = random.Random(seed)
        self.cache = JudgeCache(self.config.cache_path) if self.config.cache_path is not None else None
        self.usage = TokenUsage()
        """Cumulative since the client was made."""
        self._step_usage = TokenUsage()

    def key(self, rubric_hash: str, payload: object) -> str:
        """Cache key of a judgment: sha256 of (judge model, rubric hash, payload)."""
        return cache_key(self.model, rubric_hash, payload)

    def cache_get(self, key: str) -> str | None:
        if self.cache is None:
            return None
        value = self.cache.get(key)
        if value is not None:
            self._count(TokenUsage(cache_hits=1))
        return value

    def cache_put(self, key: str, value: str) -> None:
        if self.cache is not None:
            self.cache.put(key, value)

    def take_usage(self) -> TokenUsage:
        """Usage since the last call (one training step's judge cost), then reset."""
        usage, self._step_usage = self._step_usage, TokenUsage()
        return usage

    def _count(self, usage: TokenUsage) -> None:
        self.usage.add(usage)
        self._step_usage.add(usage)

    async def complete(self, messages: list[dict[str, str]], *, max_tokens: int | None = None) -> Completion:
        """One chat completion, retried on transient errors; raises JudgeError when out of retries.

        `max_tokens` caps this reply below the config's (a short question needs less room than a verdict).
        """
        request: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.config.temperature,
            "max_tokens": min(max_tokens, self.config.max_tokens) if max_tokens else self.config.max_tokens,
        }
        if self.config.json_mode:
            request["response_format"] = {"type": "json_object"}
        last: Exception | None = None
        for attempt in range(self.config.max_retries + 1):
            if attempt:
                delay = backoff_delay(
                    attempt - 1,
                    self.config.backoff_s,
                    self.config.backoff_max_s,
                    self.config.jitter,
                    self._rng.random(),
                )
                self._count(TokenUsage(retries=1))
                await self._sleep(delay)
            try:
                async with self._sem:
                    self._count(TokenUsage(requests=1))
                    response = await self._openai.chat.completions.create(**request)
            except openai.OpenAIError as exc:
                if not _is_transient(exc):
                    hint = _url_hint(self.endpoint) if isinstance(exc, openai.NotFoundError) else ""
                    raise JudgeError(f"judge request to {self.endpoint} failed: {exc}{hint}") from exc
                last = exc
                continue
            except ValueError as exc:  # a 200 whose JSON body does not parse (the SDK does not wrap it)
                raise JudgeError(
                    f"judge endpoint {self.endpoint} answered with a body that is not JSON: {exc}"
                ) from exc
            return self._completion(response)
        raise JudgeError(
            f"judge request to {self.endpoint} failed after {self.config.max_retries + 1} attempts: "
            f"{type(last).__name__}: {last}"
        ) from last

    def _completion(self, response: Any) -> Completion:
        """The reply text and token counts; a body that is not a chat completion is a JudgeError.

        The SDK hands back a 200 that is not JSON as a plain string, and JSON of another shape as
        an object missing its fields, so both are checked here rather than trusted.
        """
        snippet = str(response).strip().replace("\n", " ")[:80]
        not_completion = f"judge endpoint {self.endpoint} answered with a body that is not a chat completion"
        try:
            choices = response.choices
            content = choices[0].message.content if choices else None
            usage = getattr(response, "usage", None)
            prompt = int(getattr(usage, "prompt_tokens", 0) or 0)
            completion = int(getattr(usage, "completion_tokens", 0) or 0)
        except (AttributeError, TypeError, IndexError, KeyError, ValueError) as exc:
            raise JudgeError(f"{not_completion}: {snippet!r}") from exc
        if not choices:
            raise JudgeError(f"{not_completion} (no choices): {snippet!r}")
        if content is not None and not isinstance(content, str):
            raise JudgeError(
                f"judge endpoint {self.endpoint} returned content of type {type(content).__name__}, not text"
            )
        self._count(TokenUsage(prompt_tokens=prompt, completion_tokens=completion))
        return Completion(content or "", prompt, completion)

    async def check(self) -> list[str]:
        """Ask the endpoint's `/models` which models it serves; JudgeError unless `self.model` is one.

        Run before a batch: a server that is down, a base URL without /v1, or a model name the
        server does not know would otherwise fail every item, one at a time. Returns the names served.
        """
        where = f"{self.endpoint.rstrip('/')}/models"
        try:
            page = await self._openai.models.list()
            served = [str(m.id) for m in page.data]
        except openai.NotFoundError as exc:
            hint = _url_hint(self.endpoint) or "; if this server lists no models, pass --no-check"
            raise JudgeError(f"GET {where} answered 404 (not found){hint}") from exc
        except openai.APIConnectionError as exc:
            raise JudgeError(
                f"cannot reach the judge at {self.endpoint}: {exc} Is the server running?"
            ) from exc
        except openai.OpenAIError as exc:
            raise JudgeError(f"GET {where} failed: {exc}") from exc
        except (AttributeError, TypeError, ValueError) as exc:
            raise JudgeError(
                f"GET {where} did not answer with a model list{_url_hint(self.endpoint)}"
            ) from exc
        if self.model not in served:
            names = ", ".join(served[:10]) + (f" and {len(served) - 10} more" if len(served) > 10 else "")
            raise JudgeError(
                f"the judge endpoint {self.endpoint} does not serve model {self.model!r}; "
                f"it serves: {names or 'nothing'}. Pass --model with one of them"
            )
        return served

    async def aclose(self) -> None:
        """Close the cache, and the HTTP client unless it was handed in (its owner closes it)."""
        if self._owns_http:
            await self._openai.close()
        if self.cache is not None:
            self.cache.close()
