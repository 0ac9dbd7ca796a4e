"""Which Chat Completions fields the server implements: the table docs/serving.md shows, as code.

Every request field OpenAI's Chat Completions API defines is listed here as `supported`,
`limited` (supported with the limits in its note) or `refused` (a 400 naming it). A refused field
is accepted only at a value that asks for nothing (`store: false`, `modalities: ["text"]`, null);
any other value, and any field not in the table, is a 400 naming the field: a request is never
answered as if a field it sent had been honoured (the objects inside a field are held to their keys by
`serve.closed`). tests/serve/test_server_compat.py reads the table in
docs/serving.md and checks it against `REQUEST_FIELDS` and `RESPONSE_FIELDS`, and sends each
refused field to the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FieldSupport:
    status: str
    """"supported", "limited" or "refused"."""
    note: str
    inert: tuple[Any, ...] = (None,)
    """Values of a refused field that ask for nothing and are accepted."""

    @classmethod
    def refused(cls, note: str, *inert: Any) -> FieldSupport:
        """A refused field: `note` says why; null and `inert` ask for nothing and are accepted."""
        return cls("refused", note, (None, *inert))


REQUEST_FIELDS: dict[str, FieldSupport] = {
    "model": FieldSupport(
        "supported", "a served model or adapter name (`/v1/models`); another is a 404 `model_not_found`"
    ),
    "messages": FieldSupport(
        "limited",
        "roles system, developer, user, assistant, tool; text content only (an image, audio or file part is a 400)",
    ),
    "tools": FieldSupport(
        "limited",
        "function tools; `parameters` must be an object JSON schema; a call written under a grammar takes"
        " only the keys its tool declares (no `additionalProperties` counts as false)",
    ),
    "tool_choice": FieldSupport(
        "limited",
        '"none", "auto", "required", or a named function; a forced call is enforced by a grammar'
        " (on the vLLM backend, vLLM's own llguidance), a tool without `parameters` takes exactly `{}`",
    ),
    "parallel_tool_calls": FieldSupport(
        "limited",
        'true (the default) or false: at most one call, enforced by a grammar (with "auto": text or'
        " exactly one call; on the vLLM backend, vLLM's own llguidance)",
    ),
    "n": FieldSupport("limited", "1 to `--max-n` (default 64)"),
    "max_tokens": FieldSupport(
        "limited",
        "default 256; `n x max_tokens` at most `--max-request-tokens`; prompt + it within the context;"
        " a call it cuts comes back as a call with its arguments as far as written",
    ),
    "max_completion_tokens": FieldSupport("limited", "as `max_tokens`, and wins over it"),
    "temperature": FieldSupport("supported", "0 to 2; 0 is greedy and reports temperature-1 logprobs"),
    "top_p": FieldSupport("supported", "sampled logprobs are taken before the truncation (see above)"),
    "stop": FieldSupport("supported", "a string or a list of strings; the text is cut before the first"),
    "seed": FieldSupport("supported", "a signed 64-bit integer; repeatable whatever the batch"),
    "logprobs": FieldSupport("supported", "`logprobs.content` with token, logprob, bytes"),
    "top_logprobs": FieldSupport(
        "supported", "0 to 20, with `logprobs: true`; of the distribution the token was drawn from"
    ),
    "logit_bias": FieldSupport("supported", "token id (as a string) to -100 .. 100, added to the logits"),
    "presence_penalty": FieldSupport("supported", "-2 to 2, OpenAI's formula"),
    "frequency_penalty": FieldSupport("supported", "-2 to 2, OpenAI's formula"),
    "response_format": FieldSupport(
        "limited",
        "text, json_object, json_schema (strict or not), enforced by a grammar (on the vLLM backend, vLLM's"
        " own llguidance); output cut at max_tokens is a prefix",
    ),
    "stream": FieldSupport("supported", "server-sent `chat.completion.chunk` events, then `[DONE]`"),
    "stream_options": FieldSupport("limited", "`include_usage` only, with `stream: true`"),
    "store": FieldSupport.refused("nothing is stored; false is accepted", False),
    "metadata": FieldSupport.refused("only meaningful with `store`"),
    "user": FieldSupport(
        "supported", "a string of at most 256 characters, recorded in the server's log line of the request"
    ),
    "return_token_ids": FieldSupport(
        "supported",
        "vLLM's: the prompt ids also at the top of the response (`prompt_token_ids`, a stream's first chunk)",
    ),
    "return_tokens_as_token_ids": FieldSupport(
        "supported", "vLLM's: each logprob entry's `token` is \"token_id:N\""
    ),
    "skip_special_tokens": FieldSupport(
        "limited", "vLLM's: true (the default); false keeps special tokens in the content, unstreamed only"
    ),
    "safety_identifier": FieldSupport.refused("grooves keeps no per-user records"),
    "prompt_cache_key": FieldSupport.refused("no prompt cache to route"),
    "prompt_cache_retention": FieldSupport.refused("no prompt cache"),
    "prompt_cache_options": FieldSupport.refused("no prompt cache"),
    "moderation": FieldSupport.refused("no moderation"),
    "service_tier": FieldSupport.refused('one tier; "auto" and "default" are accepted', "auto", "default"),
    "modalities": FieldSupport.refused('text only; ["text"] is accepted', ["text"]),
    "audio": FieldSupport.refused("text only"),
    "prediction": FieldSupport.refused("no predicted outputs"),
    "reasoning_effort": FieldSupport.refused("not a reasoning model"),
    "verbosity": FieldSupport.refused("no verbosity control"),
    "web_search_options": FieldSupport.refused("no web search"),
    "functions": FieldSupport.refused("deprecated by OpenAI: use `tools`"),
    "function_call": FieldSupport.refused("deprecated by OpenAI: use `tool_choice`"),
}

RESPONSE_FIELDS: dict[str, FieldSupport] = {
    "id": FieldSupport("supported", "`chatcmpl-` and a random hex string"),
    "object": FieldSupport("supported", '"chat.completion", or "chat.completion.chunk" when streamed'),
    "created": FieldSupport("supported", "seconds since the epoch"),
    "model": FieldSupport("supported", "the request's `model`"),
    "choices[].index": FieldSupport("supported", "0 .. n - 1"),
    "choices[].message.role": FieldSupport("supported", '"assistant"'),
    "choices[].message.content": FieldSupport(
        "supported", "the text outside tool calls; null when there is none"
    ),
    "choices[].message.tool_calls": FieldSupport(
        "supported",
        "calls parsed from the text (id, type, function name and arguments); a call cut at max_tokens with its arguments as far as written",
    ),
    "choices[].message.refusal": FieldSupport("refused", "never sent: no refusal classifier"),
    "choices[].message.annotations": FieldSupport("refused", "never sent: no web search"),
    "choices[].message.audio": FieldSupport("refused", "never sent: text only"),
    "choices[].message.function_call": FieldSupport("refused", "never sent: calls come as `tool_calls`"),
    "choices[].finish_reason": FieldSupport(
        "limited", '"stop", "length" (also when a tool call was cut), "tool_calls"; never "content_filter"'
    ),
    "choices[].logprobs": FieldSupport(
        "supported", "`content` entries with token, logprob, bytes, top_logprobs; null unless asked"
    ),
    "choices[].token_ids": FieldSupport("supported", "grooves: the sampled ids"),
    "choices[].prompt_token_ids": FieldSupport("supported", "grooves: the prompt ids"),
    "choices[].sampled_logprobs": FieldSupport("supported", "grooves: the logprob of each sampled id"),
    "choices[].adapter_version": FieldSupport("supported", "grooves: the adapter's training step"),
    "choices[].adapter_id": FieldSupport(
        "supported", "grooves: the loaded adapter, null for the policy's own weights"
    ),
    "choices[].temperature": FieldSupport("supported", "grooves: the temperature the choice was sampled at"),
    "prompt_token_ids": FieldSupport("supported", "vLLM's place for the prompt ids, with `return_token_ids`"),
    "usage": FieldSupport("limited", "prompt_tokens, completion_tokens, total_tokens; no token details"),
    "system_fingerprint": FieldSupport("refused", "never sent"),
    "service_tier": FieldSupport("refused", "never sent"),
    "metadata": FieldSupport("refused", "never sent: nothing is stored"),
    "moderation": FieldSupport("refused", "never sent: no moderation"),
}


class FieldRefused(ValueError):
    """A request field this server does not implement; `param` names it."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def check_fields(
    body: dict[str, Any], table: dict[str, FieldSupport] | None = None, api: str = "Chat Completions"
) -> None:
    """Refuse (`FieldRefused`) a field outside the table (default: Chat Completions'), or a refused
    field at a value that asks for something."""
    table = REQUEST_FIELDS if table is None else table
    for name, value in body.items():
        support = table.get(name)
        if support is None:
            raise FieldRefused(f"{name} is not a {api} request field this server knows; remove it", name)
        if support.status == "refused" and value not in support.inert:
            raise FieldRefused(f"{name} is not supported by this server ({support.note}); remove it", name)
