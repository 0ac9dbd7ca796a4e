"""Which Responses API request fields the server implements: the table docs/serving.md shows, as code.

The same rules as Chat Completions' table (`serve.compat`): every field of OpenAI's
`responses.create` is `supported`, `limited` or `refused`; a refused field passes only at a value
that asks for nothing, and a field in neither list is a 400 naming it.
tests/serve/test_responses.py checks docs/serving.md against this table and the `openai`
client's own types, and sends each refused field.
"""

from __future__ import annotations

from grooves.serve.compat import FieldSupport

INCLUDABLE = ("message.output_text.logprobs",)
"""The `include` values the server can add to a response."""

MAX_STORED_RESPONSES = 4096
"""How many answered responses are kept (in memory) for `previous_response_id`."""

RESPONSES_FIELDS: dict[str, FieldSupport] = {
    "model": FieldSupport("supported", "a served model or adapter name; another is a 404 `model_not_found`"),
    "input": FieldSupport(
        "limited",
        "a string, or `message` items (roles user, system, developer, assistant; `input_text` and"
        " `output_text` parts), `function_call` and `function_call_output` items; another item type or"
        " content part is a 400 naming it",
    ),
    "instructions": FieldSupport(
        "supported", "a system message before the input; not carried over by `previous_response_id`"
    ),
    "tools": FieldSupport(
        "limited",
        "function tools, checked and rendered as on Chat Completions; a hosted tool (web search, file"
        " search, computer, MCP, custom) is a 400 naming its `type`; `defer_loading`, `allowed_callers`,"
        " `output_schema` and `async` pass only at values that ask for nothing",
    ),
    "tool_choice": FieldSupport(
        "limited",
        '"none", "auto", "required", or `{"type": "function", "name": ...}`; a forced call is enforced by'
        " the same grammar as on Chat Completions",
    ),
    "parallel_tool_calls": FieldSupport("limited", "as on Chat Completions"),
    "max_output_tokens": FieldSupport(
        "limited",
        "default 256; at most `--max-request-tokens`; prompt + it within the context; a response cut by it"
        ' is `status: "incomplete"`, and so is a call it cuts',
    ),
    "temperature": FieldSupport("supported", "0 to 2; 0 is greedy"),
    "top_p": FieldSupport("supported", "as on Chat Completions"),
    "top_logprobs": FieldSupport(
        "supported", "0 to 20: alternatives per token in `output_text.logprobs` (and asks for them)"
    ),
    "include": FieldSupport("limited", '`["message.output_text.logprobs"]` or `[]`; another value is a 400'),
    "text": FieldSupport(
        "limited",
        "`format` text, json_object or json_schema (strict or not), through the same grammars as"
        " `response_format`; `verbosity` is refused",
    ),
    "stream": FieldSupport(
        "supported",
        "server-sent events: response.created, output items, text and argument deltas, response.completed",
    ),
    "previous_response_id": FieldSupport(
        "limited",
        f"continues a response this server answered and kept for the same API key (the last"
        f" {MAX_STORED_RESPONSES} with `store` true, in memory: not across restarts); another id, another"
        " key's included, is a 400 naming it",
    ),
    "store": FieldSupport(
        "limited",
        "true (the default) keeps the response for `previous_response_id` only; false keeps nothing",
    ),
    "metadata": FieldSupport(
        "supported",
        "echoed back on the response; at most 16 keys of at most 64 characters, values of at most 512"
        " (OpenAI's limits), else a 400 naming it",
    ),
    "user": FieldSupport("supported", "a string of at most 256 characters, recorded in the log line"),
    "truncation": FieldSupport.refused('the context is never truncated; "disabled" is accepted', "disabled"),
    "reasoning": FieldSupport.refused("not a reasoning model"),
    "max_tool_calls": FieldSupport.refused("no hosted tools to bound"),
    "background": FieldSupport.refused("answered in the request; false is accepted", False),
    "conversation": FieldSupport.refused(
        "no stored conversations: use `previous_response_id` or send the items"
    ),
    "prompt": FieldSupport.refused("no stored prompt templates"),
    "context_management": FieldSupport.refused("no server-side compaction"),
    "stream_options": FieldSupport.refused("no obfuscation padding; {} is accepted", {}),
    "safety_identifier": FieldSupport.refused("grooves keeps no per-user records"),
    "prompt_cache_key": FieldSupport.refused("no prompt cache to route"),
    "prompt_cache_retention": FieldSupport.refused("no prompt cache"),
    "prompt_cache_options": FieldSupport.refused("no prompt cache"),
    "service_tier": FieldSupport.refused('one tier; "auto" and "default" are accepted', "auto", "default"),
    "moderation": FieldSupport.refused("no moderation"),
    "access_programs": FieldSupport.refused("no access programs"),
    "image": FieldSupport.refused("text only"),
}
