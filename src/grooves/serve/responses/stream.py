"""A streamed Responses API answer: OpenAI's Responses events over server-sent events.

The tokens are read by the chat stream's own `ChoiceStream` (whole characters, text held while
it may still become a tool call, calls sent whole once parsed); its deltas become events:

- `response.created`, `response.in_progress` (the response with no output yet);
- for text: `response.output_item.added` (a `message`), `response.content_part.added` (an
  `output_text`), a `response.output_text.delta` per delta (with `logprobs` when asked), then,
  when the text ends, `response.output_text.done`, `response.content_part.done`,
  `response.output_item.done`;
- for each call: `response.output_item.added` (a `function_call`), one
  `response.function_call_arguments.delta` with the whole arguments,
  `response.function_call_arguments.done`, `response.output_item.done` (its item `incomplete`
  when `max_output_tokens` cut it);
- `response.completed` (or `response.incomplete` when cut at `max_output_tokens`) with the whole
  response, its output items the ones streamed (the same ids) and grooves' token record.

Every event carries `type` and a `sequence_number` counting from 0. As on Chat Completions, the
status line waits for the first token (`FirstChunkResponse`), so a request that fails before it
gets an ordinary JSON error; a failure after it is an `{"error": {...}}` event (the `openai`
client raises it), then the stream ends.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from grooves.policy.base import Policy
from grooves.policy.batching import BatchScheduler
from grooves.policy.sampling import SamplingParams
from grooves.serve.errors import APIError, error_body, sampling_error
from grooves.serve.responses.turn import Turn, ends_in_cut_call, function_call_item
from grooves.serve.routing import ModelRoutes, UnknownModel
from grooves.serve.schemas import log_answer
from grooves.serve.streaming import ChoiceStream, FirstChunkResponse, forward_events, sampling_ended, sse


def event(kind: str, payload: dict[str, Any]) -> bytes:
    """One server-sent event with its `event:` line, as OpenAI sends Responses events."""
    return f"event: {kind}\ndata: {json.dumps({'type': kind} | payload, separators=(',', ':'))}\n\n".encode()


class ResponseEvents:
    """The events of one streamed response, built from its choice deltas (see the module docstring)."""

    def __init__(self, turn: Turn, logprobs: bool):
        self.turn, self.logprobs = turn, logprobs
        self.seq = 0
        self.items: list[dict[str, Any]] = []
        """The output items sent so far (a message while its text is open, then its calls)."""
        self._text: dict[str, Any] | None = None
        """The open message item, while its text is streaming."""
        self._text_logprobs: list[dict[str, Any]] = []

    def emit(self, kind: str, payload: dict[str, Any]) -> bytes:
        out = event(kind, payload | {"sequence_number": self.seq})
        self.seq += 1
        return out

    def start(self, skeleton: dict[str, Any]) -> bytes:
        return self.emit("response.created", {"response": skeleton}) + self.emit(
            "response.in_progress", {"response": skeleton}
        )

    def deltas(self, choices: list[dict[str, Any]], *, cut_call: bool = False) -> bytes:
        """The events of some choice deltas; `cut_call`: the last call in them was cut at
        `max_output_tokens` (a cut call is only ever sent with the last deltas), so its item is incomplete."""
        cut = None
        if cut_call:
            calls = [call for choice in choices for call in choice["delta"].get("tool_calls") or []]
            cut = calls[-1] if calls else None
        out = b""
        for choice in choices:
            delta = choice["delta"]
            if delta.get("content"):
                lps = (choice.get("logprobs") or {}).get("content") or [] if self.logprobs else []
                out += self._text_delta(delta["content"], lps)
            for call in delta.get("tool_calls") or []:
                out += self._close_text() + self._call(call, "incomplete" if call is cut else "completed")
        return out

    def _text_delta(self, text: str, logprobs: list[dict[str, Any]]) -> bytes:
        out = b""
        if self._text is None:
            self._text = {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            index = len(self.items)
            self.items.append(self._text)
            out += self.emit("response.output_item.added", {"output_index": index, "item": dict(self._text)})
            out += self.emit(
                "response.content_part.added",
                {
                    "item_id": self._text["id"],
                    "output_index": index,
                    "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                },
            )
            self._text["content"] = [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]
        part = self._text["content"][0]
        part["text"] += text
        part["logprobs"] += logprobs
        return out + self.emit(
            "response.output_text.delta",
            {
                "item_id": self._text["id"],
                "output_index": self.items.index(self._text),
                "content_index": 0,
                "delta": text,
                "logprobs": logprobs,
            },
        )

    def _close_text(self, status: str = "completed") -> bytes:
        if self._text is None:
            return b""
        item, self._text = self._text, None
        item["status"] = status
        index, part = self.items.index(item), item["content"][0]
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return (
            self.emit(
                "response.output_text.done", where | {"text": part["text"], "logprobs": part["logprobs"]}
            )
            + self.emit("response.content_part.done", where | {"part": part})
            + self.emit("response.output_item.done", {"output_index": index, "item": item})
        )

    def _call(self, call: dict[str, Any], status: str) -> bytes:
        item = function_call_item(call, status)
        index = len(self.items)
        self.items.append(item)
        args = item["arguments"]
        where = {"item_id": item["id"], "output_index": index}
        return (
            self.emit(
                "response.output_item.added",
                {"output_index": index, "item": item | {"arguments": "", "status": "in_progress"}},
            )
            + self.emit("response.function_call_arguments.delta", where | {"delta": args})
            + self.emit(
                "response.function_call_arguments.done", where | {"arguments": args, "name": item["name"]}
            )
            + self.emit("response.output_item.done", {"output_index": index, "item": item})
        )

    def finish(self, body: dict[str, Any]) -> bytes:
        """The last events: the open text closed, then the whole response."""
        cut = body["status"] == "incomplete"
        out = self._close_text("incomplete" if cut else "completed")
        return out + self.emit("response.incomplete" if cut else "response.completed", {"response": body})


def stream_response(
    policy: Policy, scheduler: BatchScheduler, adapters: ModelRoutes, turn: Turn, params: SamplingParams
) -> FirstChunkResponse:
    """The request as Responses events; the client leaving withdraws it from the sampler."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    params.on_tokens = forward_events(loop, queue)
    req, prompts = turn.req, policy.prompts
    choice = ChoiceStream(
        0,
        policy.tokenizer,
        prompts.eos_token_ids,
        [],
        prompts.tool_format.syntax,
        turn.tools,
        req.wants_logprobs,
    )
    events = ResponseEvents(turn, req.wants_logprobs)

    async def body_events():
        sampling = None
        try:
            with adapters.lease(req.model) as route:
                version = adapters.version_of(route)
                sampling = asyncio.ensure_future(
                    scheduler.submit(turn.prompt_ids, params, adapter=route.adapter_id)
                )
                sampling.add_done_callback(lambda task: sampling_ended(task, queue))
                step = await queue.get()  # the status line waits for the first token
                if step is None and sampling.exception() is not None:
                    raise sampling_error(sampling.exception())
                skeleton = {
                    "id": turn.response_id,
                    "object": "response",
                    "created_at": turn.created,
                    "status": "in_progress",
                    "model": req.model,
                    "output": [],
                }
                yield events.start(skeleton)
                completion = None
                while step is not None:
                    out = b""
                    for token in step:
                        out += events.deltas(choice.token(token))
                        if token.completion is not None:
                            completion = token.completion
                            last, parsed = choice.finish(completion, {})
                            out += events.deltas(last, cut_call=ends_in_cut_call(parsed))
                    if out:
                        yield out
                    step = await queue.get()
                try:
                    completions = sampling.result()
                except Exception as exc:  # headers are out: the error goes in the stream
                    error = sampling_error(exc)
                    yield sse(error_body(error.message, kind=error.kind, param=error.param))
                    return
                completion = completions[0]
                cut = completion.finish_reason == "length"
                prompts.parse(completion.text, turn.tools, cut=cut)  # counted and logged as unstreamed
                message = choice.message()
                await asyncio.to_thread(turn.remember, policy, message, completion)
                body = turn.body(list(events.items), completion, version, route.adapter_id)
                yield events.finish(body)
                log_answer(turn.chat, len(turn.prompt_ids), [(completion, completion.finish_reason)])
        except UnknownModel as exc:
            raise APIError(404, str(exc), "model", "model_not_found") from exc
        finally:
            if sampling is not None and not sampling.done():
                sampling.cancel()

    return FirstChunkResponse(
        body_events(), media_type="text/event-stream", headers={"cache-control": "no-cache"}
    )
