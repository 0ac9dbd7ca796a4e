"""One answered Responses API request: how its sample becomes output items and a `response` object.

`Turn` keeps what the request was read as (its chat messages, tools and prompt ids), turns the
sample into a `message` item (the text, with logprobs when asked) and `function_call` items (the
last one `incomplete` when `max_output_tokens` cut it),
remembers the turn's token ids for the next request that sends it back, and, with `store`, keeps
its messages in the `ResponseStore` that `previous_response_id` reads.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from typing import Any

from grooves.policy.base import Policy
from grooves.policy.sampling import Completion
from grooves.policy.tool_calls import ParsedOutput
from grooves.serve.errors import APIError
from grooves.serve.responses.fields import MAX_STORED_RESPONSES
from grooves.serve.schemas import logprobs_block, token_record


class ResponseStore:
    """The chat messages of answered responses, for `previous_response_id` (bounded, in memory).

    A response is kept under the tenant (API key) that made it, and only that tenant reads it: to
    any other, its id is as unknown as an id never given out."""

    def __init__(self, limit: int = MAX_STORED_RESPONSES):
        self.limit = limit
        self._items: OrderedDict[tuple[str, str], list[dict[str, Any]]] = OrderedDict()

    def get(self, tenant: str, response_id: str) -> list[dict[str, Any]]:
        kept = self._items.get((tenant, response_id))
        if kept is None:
            raise APIError(
                400,
                f"previous_response_id {response_id!r} is not a response this server keeps for this API key (it "
                f"keeps the last {self.limit} answered with store true, in memory); send the earlier items in "
                "input instead",
                "previous_response_id",
            )
        return [dict(m) for m in kept]

    def put(self, tenant: str, response_id: str, messages: list[dict[str, Any]]) -> None:
        self._items[(tenant, response_id)] = messages
        while len(self._items) > self.limit:
            self._items.popitem(last=False)


class Turn:
    """One answered request: what it was read as, and how its output becomes Responses items."""

    def __init__(self, req, chat, messages, tools, prompt_ids, store: ResponseStore | None, tenant: str):
        self.req, self.chat, self.messages, self.tools = req, chat, messages, tools
        self.prompt_ids, self.store, self.tenant = prompt_ids, store, tenant
        self.kept = messages[1:] if req.instructions else list(messages)
        """The conversation without the instructions: what `previous_response_id` carries over."""
        self.response_id = f"resp_{uuid.uuid4().hex}"
        self.created = int(time.time())

    def answer(self, policy: Policy, completion: Completion, version: int | None, adapter_id: str | None):
        """The whole `response` object of an unstreamed request (and the turn remembered)."""
        cut = completion.finish_reason == "length"
        parsed = policy.prompts.parse(completion.text, self.tools, cut=cut)
        logprobs = self.logprobs(policy, completion)
        items = []
        if parsed.content:
            items.append(message_item(parsed.content, logprobs, cut))
        calls = [function_call_item(call) for call in parsed.tool_calls]
        if calls and ends_in_cut_call(parsed):
            calls[-1]["status"] = "incomplete"
        items += calls
        self.remember(
            policy,
            {"role": "assistant", "content": parsed.content, "tool_calls": parsed.tool_calls},
            completion,
        )
        return self.body(items, completion, version, adapter_id)

    def logprobs(self, policy: Policy, completion: Completion) -> list[dict[str, Any]]:
        if not self.req.wants_logprobs:
            return []
        return logprobs_block(
            policy.tokenizer, completion.token_ids, completion.logprobs, completion.top_logprobs
        )["content"]

    def remember(self, policy: Policy, message: dict[str, Any], completion: Completion) -> None:
        """Keep the turn's token ids (for the next request that sends it back) and, with `store`,
        its messages for `previous_response_id`."""
        if not message.get("tool_calls"):
            message = {k: v for k, v in message.items() if k != "tool_calls"}
        policy.prompts.remember(self.messages, self.tools, message, self.prompt_ids, completion)
        if self.store is not None:
            self.store.put(self.tenant, self.response_id, [*self.kept, message])

    def body(
        self, items: list[dict[str, Any]], completion: Completion, version: int | None, adapter_id: str | None
    ) -> dict[str, Any]:
        """The `response` object around its output items, with grooves' token record."""
        req = self.req
        cut = completion.finish_reason == "length"
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created,
            "status": "incomplete" if cut else "completed",
            "completed_at": int(time.time()),
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {},
            "model": req.model,
            "output": items,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "store": req.store is not False,
            "temperature": req.temperature,
            "text": req.text or {"format": {"type": "text"}},
            "tool_choice": req.tool_choice or "auto",
            "tools": req.tools or [],
            "top_logprobs": req.top_logprobs or 0,
            "top_p": req.top_p,
            "truncation": "disabled",
            "usage": usage(len(self.prompt_ids), len(completion.token_ids)),
            "user": req.user,
        } | token_record(
            completion,
            self.prompt_ids,
            adapter_version=version,
            adapter_id=adapter_id,
            temperature=req.temperature,
        )


def message_item(text: str, logprobs: list[dict[str, Any]], cut: bool) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "status": "incomplete" if cut else "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}],
    }


def function_call_item(call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {
        "id": f"fc_{uuid.uuid4().hex}",
        "type": "function_call",
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": status,
    }


def ends_in_cut_call(parsed: ParsedOutput) -> bool:
    """Whether the last of the parsed calls was cut at `max_output_tokens` (its arguments as far as
    written): its item is `incomplete`, as the response is."""
    return parsed.cut is not None and parsed.cut.last == "partial"


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }
