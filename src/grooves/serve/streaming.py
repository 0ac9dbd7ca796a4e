"""Streamed chat completions: OpenAI's `chat.completion.chunk` events over server-sent events.

The sampler reports each token as it is drawn (`SamplingParams.on_token`, on its own thread); the
request's handler turns those reports into chunks on the event loop. Per choice (`ChoiceStream`):

- a first chunk with `delta: {"role": "assistant", "content": ""}`;
- content deltas as the text grows (`policy.text_stream.TextStream`: whole characters, nothing
  that a stop string could still take back);
- tool calls (`policy.tool_calls.CallStream`): text that may start a call is held until its block
  is complete, then goes out as `delta.tool_calls` entries (`index`, `id`, `type`, `function.name`
  and the whole `function.arguments`), or as content if it does not parse: a block that turns out
  not to be a call cannot be taken back once sent as one;
- `logprobs.content` for the tokens since the choice's previous chunk, when asked;
- a final chunk with `finish_reason` and grooves' fields (`token_ids`, `prompt_token_ids`,
  `sampled_logprobs`, `adapter_version`, `adapter_id`, `temperature`), sent as soon as that
  sample ends.

One chunk carries what one decode step gave all of a request's choices: with `n > 1` its
`choices` holds a delta per choice that has one (OpenAI's chunk allows several, each `index` at
most once), so the choices interleave by `index` and a step costs one event, not n.

Then, with `stream_options.include_usage`, a chunk with no choices and the request's `usage`
(every other chunk carries `usage: null`), and `data: [DONE]`.

The status line and headers go out with the first chunk, once the sampler has drawn the first
token (`FirstChunkResponse`): a request that fails before that (its grammar reaching a limit on
the first token, its model removed) is answered with the status and JSON error an unstreamed
request gets. A failure after the first chunk is an event `{"error": {...}}` (OpenAI's shape; the
`openai` client raises it), then the stream ends.

A choice cut at max_tokens inside a tool call sends that call (`tool_calls.parse_cut`): its
arguments as far as written, `finish_reason` "length"; never the call's markup as content.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from grooves.policy.base import Policy
from grooves.policy.batching import BatchScheduler
from grooves.policy.sampling import Completion, SamplingParams, TokenEvent
from grooves.policy.text_stream import TextStream
from grooves.policy.tool_calls import CallStream, CallSyntax, ParsedOutput
from grooves.serve.errors import APIError, error_body, sampling_error
from grooves.serve.routing import ModelRoutes, UnknownModel
from grooves.serve.schemas import ChatRequest, log_answer, logprobs_block, token_record, usage_body

log = logging.getLogger("grooves.server")


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event: `data: <json>` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


class ChoiceStream:
    """The chunks of one choice, built from its sampled tokens (see module docstring)."""

    def __init__(
        self, index: int, tokenizer, eos_token_ids, stop: list[str], syntax: CallSyntax, tools, logprobs: bool
    ):
        self.index, self.tokenizer, self.logprobs = index, tokenizer, logprobs
        self.text = TextStream(tokenizer, eos_token_ids, stop)
        self.calls = CallStream(syntax, tools)
        self._pending: list[tuple[int, float, list[tuple[int, float]] | None]] = []
        self._calls_sent = 0
        self._space = ""
        """Whitespace at the end of the content so far, held: a whole parse strips it when calls follow."""
        self.content = ""
        self.tool_calls: list[dict[str, Any]] = []
        """What was sent: the message the client puts together (and may send back next turn)."""
        self.done = False
        self.as_ids = False
        """vLLM's `return_tokens_as_token_ids`: logprob entries name their token as "token_id:N"."""

    def first(self) -> dict[str, Any]:
        return self._choice({"role": "assistant", "content": ""})

    def token(self, event: TokenEvent) -> list[dict[str, Any]]:
        """Choice deltas after one sampled token (none while its text is held back)."""
        self._pending.append((event.token, event.logprob, event.top_logprobs))
        content, calls = self.calls.feed(self.text.feed([event.token]))
        return self._deltas(content, calls)

    def finish(
        self, completion: Completion, extras: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], ParsedOutput]:
        """The choice's last deltas and final chunk, and the parse of its whole text (for the message record)."""
        cut = completion.finish_reason == "length"
        content, calls = self.calls.feed(self.text.finish(completion.text))
        rest, more, parsed = self.calls.finish(cut=cut)
        out = self._deltas(content + rest, calls + more)
        if self._space and not self.tool_calls:  # no call came: the text keeps its trailing whitespace
            out.append(self._choice({"content": self._space}))
            self.content += self._space
        finish = "tool_calls" if self._calls_sent and not cut else completion.finish_reason
        out.append(self._choice({}, finish_reason=finish) | extras)
        self.done = True
        return out, parsed

    def _deltas(self, content: str, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        if content:
            content = self._space + content
            body = content.rstrip()
            self._space = content[len(content.rstrip()) :]
            if body:
                out.append(self._choice({"content": body}))
                self.content += body
        for call in calls:
            entry = {
                "index": self._calls_sent,
                "id": call["id"],
                "type": "function",
                "function": dict(call["function"]),
            }
            self._calls_sent += 1
            self.tool_calls.append(call)
            out.append(self._choice({"tool_calls": [entry]}))
        return out

    def message(self) -> dict[str, Any]:
        """The assistant message as the client assembles it from the deltas sent."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message

    def _choice(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        block = None
        if self.logprobs and self._pending and (delta or finish_reason):
            ids, lps, tops = zip(*self._pending, strict=True)
            top = [t or [] for t in tops] if any(t is not None for t in tops) else None
            block = logprobs_block(self.tokenizer, list(ids), list(lps), top, as_ids=self.as_ids)
            self._pending = []
        elif not self.logprobs:
            self._pending = []
        return {"index": self.index, "delta": delta, "logprobs": block, "finish_reason": finish_reason}


class ChunkWriter:
    """Wraps choice deltas into `chat.completion.chunk` events of one response."""

    def __init__(self, response_id: str, created: int, model: str, include_usage: bool):
        self.base = {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model}
        self.include_usage = include_usage

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(self.base | {"choices": choices} | ({"usage": None} if self.include_usage else {}) | extra)

    def chunks(self, deltas: list[dict[str, Any]]) -> bytes:
        """Events for a step's choice deltas: chunk k holds each choice's k-th delta, so no chunk names
        one `index` twice (a client may keep one entry per index) and most steps are one chunk."""
        rounds: list[list[dict[str, Any]]] = []
        seen: dict[int, int] = {}
        for delta in deltas:
            k = seen.get(delta["index"], 0)
            seen[delta["index"]] = k + 1
            if k == len(rounds):
                rounds.append([])
            rounds[k].append(delta)
        return b"".join(self.chunk(r) for r in rounds)

    def usage(self, usage: dict[str, int]) -> bytes:
        return sse(self.base | {"choices": [], "usage": usage})


def forward_events(loop, queue) -> Callable[[list[TokenEvent]], None]:
    """A sampler `on_tokens` that hands each step's events to `queue` on the event loop (thread-safe, never blocks)."""

    def on_tokens(events: list[TokenEvent]) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, events)
        except RuntimeError:  # the loop has closed: nobody is listening any more
            pass

    return on_tokens


def sampling_ended(task: asyncio.Future, queue: asyncio.Queue) -> None:
    """The sampling ended: wake the stream, and read its outcome so that an error after the client
    left (the sampler closing under a Ctrl-C) is not printed as an exception nobody retrieved."""
    queue.put_nowait(None)
    if not task.cancelled():
        task.exception()


class FirstChunkResponse(StreamingResponse):
    """A stream whose status and headers go out with its first chunk: an `APIError` raised before
    that chunk is answered as an unstreamed request's error (its status and JSON body)."""

    async def __call__(self, scope, receive, send) -> None:
        body = aiter(self.body_iterator)
        try:
            first = await anext(body)
        except APIError as exc:
            error = error_body(exc.message, kind=exc.kind, param=exc.param, code=exc.code)
            await JSONResponse(error, status_code=exc.status)(scope, receive, send)
            return
        except StopAsyncIteration:
            first = None

        async def chained():
            if first is not None:
                yield first
            async for chunk in body:
                yield chunk

        self.body_iterator = chained()
        await super().__call__(scope, receive, send)


def stream_completion(
    policy: Policy,
    scheduler: BatchScheduler,
    adapters: ModelRoutes,
    req: ChatRequest,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    prompt_ids: list[int],
    params: SamplingParams,
) -> StreamingResponse:
    """The request as server-sent events. The client leaving cancels the generator, which withdraws
    the request: the sampler drops its rows at the next decode step."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    params.on_tokens = forward_events(loop, queue)
    include_usage = bool((req.stream_options or {}).get("include_usage"))
    writer = ChunkWriter(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), req.model, include_usage)
    prompts = policy.prompts
    choices = [
        ChoiceStream(
            i,
            policy.tokenizer,
            prompts.eos_token_ids,
            req.stop or [],
            prompts.tool_format.syntax,
            tools,
            bool(req.logprobs),
        )
        for i in range(req.n)
    ]
    for choice in choices:
        choice.as_ids = bool(req.return_tokens_as_token_ids)
    first = {"prompt_token_ids": prompt_ids} if req.return_token_ids else {}  # vLLM's place, first chunk
    finished: dict[int, tuple[Completion, str]] = {}
    """Choice index -> (its completion, the finish reason sent), for the request's log line."""

    async def step_deltas(step: list[TokenEvent], route, version) -> list[dict[str, Any]]:
        deltas = []
        for event in step:
            choice = choices[event.index]
            deltas += choice.token(event)
            if event.completion is None:
                continue
            record = token_record(
                event.completion,
                prompt_ids,
                adapter_version=version,
                adapter_id=route.adapter_id,
                temperature=req.temperature,
            )
            last = choice.finish(event.completion, record)[0]
            deltas += last
            finished[event.index] = (event.completion, last[-1]["finish_reason"])
            cut = event.completion.finish_reason == "length"
            prompts.parse(
                event.completion.text, tools, cut=cut
            )  # counted and logged as an unstreamed answer is
            await asyncio.to_thread(
                prompts.remember, messages, tools, choice.message(), prompt_ids, event.completion
            )
        return deltas

    async def events():
        sampling = None
        try:
            with adapters.lease(req.model) as route:  # the adapter stays loaded until the stream ends
                version = adapters.version_of(route)
                sampling = asyncio.ensure_future(
                    scheduler.submit(prompt_ids, params, adapter=route.adapter_id)
                )
                sampling.add_done_callback(lambda task: sampling_ended(task, queue))
                step = await queue.get()  # the first chunk waits for the first token (`FirstChunkResponse`)
                if step is None and sampling.exception() is not None:
                    raise sampling_error(sampling.exception())
                yield writer.chunk([c.first() for c in choices], **first)
                while step is not None:
                    deltas = await step_deltas(step, route, version)
                    if deltas:
                        yield writer.chunks(deltas)
                    step = await queue.get()
                try:
                    completions = sampling.result()
                except Exception as exc:  # headers are out: the error goes in the stream, as OpenAI sends it
                    error = sampling_error(exc)
                    yield sse(error_body(error.message, kind=error.kind, param=error.param))
                    return
                if include_usage:
                    yield writer.usage(
                        usage_body(len(prompt_ids), sum(len(c.token_ids) for c in completions))
                    )
                yield sse("[DONE]")
                log_answer(req, len(prompt_ids), [finished[i] for i in sorted(finished)])
        except UnknownModel as exc:  # removed after the request was checked, before the stream began
            raise APIError(404, str(exc), "model", "model_not_found") from exc
        finally:
            if sampling is not None and not sampling.done():  # the client left: withdraw the request
                sampling.cancel()

    return FirstChunkResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-cache"})
