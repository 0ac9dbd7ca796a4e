"""Constrained decoding: `response_format` and forced tool calls as a grammar mask on each sampled row.

A request that asks for JSON (`response_format` `json_object`, or `json_schema` with its schema)
or forces a tool call (`tool_choice` "required" or a named function) gets a grammar: llguidance's
Lark dialect, with `%json {schema}` for the JSON parts and the policy's tool-call syntax around
them (`policy/tool_calls.py`). Before each token, every row of the request asks its own grammar
state which tokens may come next, and the sampler sets the others' logits to -inf
(`GrammarMask`, a `RowLogits` hook); the sampled token then advances that state. When the grammar
is complete only an end-of-turn token is allowed, so a completion that was not cut at
`max_tokens` always parses and validates.

Why llguidance: measured with `benchmarks/bench_grammar.py` on SmolLM2's 49,152-token vocabulary
(docs/serving.md, "Structured output"), it computes a token mask as fast as xgrammar and
outlines-core within the noise of a decode step, compiles a grammar 7-10x faster than xgrammar
and 50x faster than outlines-core (so a grammar per request needs no cache), handles JSON of any
depth (outlines-core's regular expressions stop at a fixed nesting), installs as one wheel with no
dependencies (xgrammar pulls in triton and a CUDA-oriented runtime), reports an uncompilable
schema as a message instead of an exception, and is what vLLM's `guidance` backend runs, so the
same grammar text serves both backends.

JSON is written on one line with `", "` and `": "` between items and keys (as Python's
`json.dumps` writes it): a grammar that allowed any whitespace let a small model pad its output
with newlines until `max_tokens`.

Sampled logprobs: a row's logprob is that of the masked distribution it was drawn from,
log_softmax over the allowed tokens only (renormalized). The trainer recomputes the unconstrained
logprob, which is lower by -log(mass of the allowed tokens); see `allowed_mass_mismatch` and
docs/training.md for how the trainer treats it.

`strict`: with `json_schema.strict: true` (or a tool's `function.strict: true`) every keyword of
the schema must be enforceable, and one llguidance does not implement is refused; without it such
keywords are ignored (`lenient`), and the rest of the schema is still enforced.

A call written under a grammar takes only the arguments its tool declares: an object schema that
lists `properties` and says nothing of `additionalProperties` is closed (`additionalProperties:
false`, as OpenAI's strict tools require), and a tool without `parameters` takes exactly `{}`
(`closed_schema`). Left open, a small model filled the room with the keys of its prompt's example
(`{"argument1": "value1"}`). A tool's `$defs` (and `$ref`s into them) keep working inside the call.

`parallel_tool_calls: false` with `tool_choice` "auto" is a grammar too: either text that holds no
call (`CallSyntax.text_lexeme`) or exactly one call.

Limits: llguidance bounds the work of one grammar (`LIMITS`, its defaults). A schema that compiles
but reaches a limit while sampling (an infinitely recursive required object, a regular expression
like `^(a{1000}){1000}$`) raises `GrammarFailed` naming the request field, which the server answers
with a 400.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
import torch

from grooves.policy.tool_calls import CallSyntax

JSON_FORMAT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""llguidance's JSON options for every JSON part: one line, `json.dumps`' separators."""


class ConstraintError(ValueError):
    """A response_format or tool_choice that cannot be turned into a grammar; `param` names the request field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class GrammarFailed(RuntimeError):
    """A request's grammar reached one of llguidance's limits while sampling; `param` names the request field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class _Limits(TypedDict):
    max_items_in_row: int
    initial_lexer_fuel: int
    step_lexer_fuel: int
    step_max_items: int
    max_lexer_states: int
    max_grammar_size: int


LIMITS: _Limits = {
    "max_items_in_row": 2_000,
    "initial_lexer_fuel": 1_000_000,
    "step_lexer_fuel": 200_000,
    "step_max_items": 50_000,
    "max_lexer_states": 250_000,
    "max_grammar_size": 500_000,
}
"""llguidance's limits on one grammar (its defaults, stated here so docs/serving.md can list them):
the Earley items of one row and of one token's step, the lexer's work to build its regular
expressions and per token, its states, and the grammar's size in symbols."""


@dataclass(frozen=True)
class RequestGrammar:
    """The grammar of one request, and the JSON schemas in it with the request field each came from."""

    lark: str
    param: str
    """The request field the grammar as a whole comes from."""
    schemas: tuple[tuple[str, str, bool], ...]
    """(param, llguidance grammar of that schema alone, whether it is strict): a strict one is checked
    alone first (the whole grammar may hold it leniently), the others when the whole grammar fails,
    so that an error names its field."""

    @property
    def sampling_param(self) -> str:
        """The field to name when the grammar fails while sampling: its one schema's, else the whole grammar's."""
        return self.schemas[0][0] if len(self.schemas) == 1 else self.param


def _with_options(schema: dict[str, Any], strict: bool) -> dict[str, Any]:
    options = JSON_FORMAT | ({} if strict else {"lenient": True})
    return dict(schema) | {"x-guidance": options}


def _json_rule(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps(schema)


def response_format_schema(response_format: dict[str, Any] | None) -> tuple[dict[str, Any], str] | None:
    """(the JSON schema with llguidance's options, the param naming it) for a response_format; None for text."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise ConstraintError(
            "response_format must be an object like {'type': 'json_object'}", "response_format"
        )
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return _with_options({"type": "object"}, strict=False), "response_format"
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise ConstraintError(
                "response_format.json_schema must be an object with a 'name' and a 'schema' object",
                "response_format.json_schema",
            )
        strict = spec.get("strict") is True
        return _with_options(spec.get("schema", {}), strict=strict), "response_format.json_schema.schema"
    raise ConstraintError(
        f"response_format type {kind!r} is unknown; use 'text', 'json_object' or 'json_schema'",
        "response_format.type",
    )


def _forced_tools(tools: list[dict[str, Any]] | None, tool_choice: Any) -> tuple[list[int], bool] | None:
    """(indices of the tools a forced call may name, whether several calls may follow), or None if nothing is forced."""
    if tool_choice in (None, "auto", "none"):
        return None
    if not tools:
        raise ConstraintError(f"tool_choice={tool_choice!r} needs tools", "tool_choice")
    if tool_choice == "required":
        return list(range(len(tools))), True
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        name = (tool_choice.get("function") or {}).get("name")
        names = [t.get("function", t).get("name") for t in tools]
        if name not in names:
            raise ConstraintError(
                f"tool_choice names function {name!r}, which is not in tools ({names})",
                "tool_choice.function.name",
            )
        return [names.index(name)], False
    raise ConstraintError(
        f"tool_choice={tool_choice!r} is not one of 'none', 'auto', 'required' or {{'type': 'function', 'function': {{'name': ...}}}}",
        "tool_choice",
    )


_SUBSCHEMA = ("items", "contains", "not", "if", "then", "else", "additionalProperties", "propertyNames")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_OPEN_BY = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_COMBINED_BY = ("allOf", "anyOf", "oneOf", "$ref", "if", "dependentSchemas")


def closed_schema(schema: Any, *, top: bool = True) -> Any:
    """A copy of a tool's `parameters` in which the object schemas take only the keys they declare.

    An object schema that lists `properties` (and the top level, which is always an object) gets
    `additionalProperties: false` unless it says otherwise (`additionalProperties`,
    `patternProperties`, `unevaluatedProperties`) or combines with other schemas (`allOf`, `anyOf`,
    `oneOf`, `$ref`, ...), where closing one part would refuse the keys another declares. A nested
    `{"type": "object"}` without `properties` stays a free-form object.

    >>> closed_schema({"type": "object", "properties": {"a": {"type": "object", "properties": {}}, "b": {"type": "object"}}})
    {'type': 'object', 'properties': {'a': {'type': 'object', 'properties': {}, 'additionalProperties': False}, 'b': {'type': 'object'}}, 'additionalProperties': False}
    """
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for k in _SUBSCHEMA:
        if k in out:
            out[k] = closed_schema(out[k], top=False)
    for k in _SUBSCHEMA_LISTS:
        if isinstance(out.get(k), list):
            out[k] = [closed_schema(v, top=False) for v in out[k]]
    for k in _SUBSCHEMA_MAPS:
        if isinstance(out.get(k), dict):
            out[k] = {name: closed_schema(v, top=False) for name, v in out[k].items()}
    declares = "properties" in out or (top and out.get("type", "object") == "object")
    if declares and not any(k in out for k in _OPEN_BY + _COMBINED_BY):
        out["additionalProperties"] = False
    return out


def _refs_under(schema: Any, prefix: str) -> Any:
    """`schema` with each local `$ref` ("#...") pointing into `prefix` instead of the root."""
    if isinstance(schema, list):
        return [_refs_under(v, prefix) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _refs_under(v, prefix) for k, v in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = prefix + ref[1:]
    return out


def _call_schema(
    tools: list[dict[str, Any]], indices: list[int], key: str
) -> tuple[dict[str, Any], list[tuple[str, dict]]]:
    """The JSON schema of one call to any of these tools, and each tool's own arguments schema with its param.

    The arguments are `closed_schema`s. A tool whose schema holds `$ref`s moves to the call's
    `$defs` (as `tool<i>`, its own `$ref`s pointed there), since inside the call "#" is the call.
    """
    options, parts, defs = [], [], {}
    for i in indices:
        fn = tools[i].get("function", tools[i])
        params = closed_schema(fn.get("parameters") or {"type": "object", "properties": {}})
        strict = fn.get("strict") is True
        parts.append((f"tools[{i}].function.parameters", _with_options(params, strict)))
        if '"$ref"' in json.dumps(params):
            defs[f"tool{i}"] = _refs_under(params, f"#/$defs/tool{i}")
            params = {"$ref": f"#/$defs/tool{i}"}
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, key: params},
                "required": ["name", key],
                "additionalProperties": False,
            }
        )
    call: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    if defs:
        call = {"$defs": defs} | call
    return _with_options(
        call, strict=all(tools[i].get("function", {}).get("strict") is True for i in indices)
    ), parts


def request_grammar(
    syntax: CallSyntax,
    *,
    response_format: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool = True,
) -> RequestGrammar | None:
    """The grammar a request's response_format and tool_choice impose, or None when they impose none.

    A forced call (tool_choice "required" or a named function) is the whole output: one or more
    calls for "required" (one with `parallel_tool_calls` false), exactly one for a named function.
    Otherwise a JSON response_format is the output, or, with tools the model may call (tool_choice
    "auto"), either the JSON or calls in the policy's syntax (one call with `parallel_tool_calls`
    false). Without a response_format, "auto" with `parallel_tool_calls` false is text that holds
    no call, or exactly one call; with it true, "auto" imposes nothing.
    """
    forced = _forced_tools(tools, tool_choice)
    fmt = response_format_schema(response_format)
    key = getattr(syntax, "key", "arguments")
    if forced is not None:
        indices, multiple = forced
        assert tools is not None  # `_forced_tools` refuses a forced call without tools
        multiple = multiple and parallel_tool_calls
        call, parts = _call_schema(tools, indices, key)
        lark = "start: tool_calls\n" + syntax.grammar(call, multiple=multiple, key=key)
        return RequestGrammar(lark, "tool_choice", tuple(_schema_check(p, s) for p, s in parts))
    callable_tools = bool(tools) and tool_choice != "none"
    if fmt is None and not (callable_tools and not parallel_tool_calls):
        return None
    checks, param = [], "parallel_tool_calls"
    if fmt is not None:
        schema, param = fmt
        checks.append(_schema_check(param, schema))
        content = _json_rule(schema)
    else:
        content = syntax.text_lexeme()
    if callable_tools and tools:  # `and tools`: implied, and narrows its type
        call, parts = _call_schema(tools, list(range(len(tools))), key)
        checks += [_schema_check(p, s) for p, s in parts]
        lark = (
            'start: tool_calls | content\ncontent: TEXT | ""\n' + f"TEXT: {content}\n"
            if fmt is None
            else "start: tool_calls | content\ncontent: " + content + "\n"
        )
        lark += syntax.grammar(call, multiple=parallel_tool_calls, key=key)
    else:
        lark = "start: " + content
    return RequestGrammar(lark, param, tuple(checks))


def _schema_check(param: str, schema: dict[str, Any]) -> tuple[str, str, bool]:
    return param, "start: " + _json_rule(schema), not schema["x-guidance"].get("lenient", False)


class GrammarCompiler:
    """Compiles request grammars for one tokenizer (llguidance's view of it is built once, about 0.2 s)."""

    def __init__(self, tokenizer, eos_token_ids: set[int]):
        import llguidance
        import llguidance.hf

        self._ll = llguidance
        self.eos_token_ids = sorted(eos_token_ids)
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, eos_token=self.eos_token_ids)
        self.limits = llguidance.LLParserLimits(**LIMITS)

    def compile(self, grammar: RequestGrammar) -> Constraint:
        """A `Constraint` for `grammar`; `ConstraintError` naming the request field when llguidance refuses it.

        Compiling a large schema takes seconds (5,000 properties: several on this 2-core machine):
        the server calls this on a worker thread, never on its event loop.
        """
        for param, text, strict in grammar.schemas:
            if strict and text != grammar.lark:  # the whole grammar may hold a strict schema leniently
                self._check(text, param)
        matcher = self._ll.LLMatcher(
            self.tokenizer,
            self._ll.LLMatcher.grammar_from_lark(grammar.lark),
            log_level=0,
            limits=self.limits,
        )
        if matcher.is_error():
            for param, text, _ in grammar.schemas:  # each schema alone, so the error names its field
                self._check(text, param)
            raise ConstraintError(
                f"{grammar.param} cannot be enforced: {library_reason(matcher.get_error())}", grammar.param
            )
        return Constraint(
            matcher, self.tokenizer.vocab_size, self.eos_token_ids, grammar.sampling_param, lark=grammar.lark
        )

    def _check(self, lark: str, param: str) -> None:
        error = self._ll.LLMatcher.validate_grammar(
            self._ll.LLMatcher.grammar_from_lark(lark), self.tokenizer, limits=self.limits
        )
        if error:
            raise ConstraintError(f"{param} cannot be enforced: {library_reason(error)}", param)


def library_reason(error: str) -> str:
    """llguidance's message without the position in our generated grammar text and the echo of it.

    >>> library_reason('at 1(8): failed to compile JSON schema: Unimplemented keys: ["uniqueItems"]\\n   1 | start: %json')
    'failed to compile JSON schema: Unimplemented keys: ["uniqueItems"]'
    """
    first = error.strip().splitlines()[0] if error.strip() else error
    return re.sub(r"^at \d+\(\d+\):\s*", "", first)


class Constraint:
    """One request's compiled grammar; calling it gives a sampled row its own `GrammarMask`. `lark` is
    the grammar's text, which the vLLM backend hands to vLLM's own llguidance (`policy/vllm.py`)."""

    def __init__(
        self,
        matcher,
        vocab_size: int,
        eos_token_ids: list[int],
        param: str = "response_format",
        lark: str | None = None,
    ):
        self._matcher, self.vocab_size, self.eos_token_ids = matcher, vocab_size, eos_token_ids
        self.param = param
        """The request field a failure while sampling names (`GrammarFailed`)."""
        self.lark = lark

    def __call__(self) -> GrammarMask:
        return GrammarMask(self._matcher.deep_copy(), self.vocab_size, self.eos_token_ids, self.param)


class GrammarMask:
    """A row's grammar state: masks the logits of tokens the grammar does not allow next (`RowLogits`)."""

    def __init__(self, matcher, vocab_size: int, eos_token_ids: list[int], param: str = "response_format"):
        self.matcher, self.vocab_size, self.eos_token_ids = matcher, vocab_size, eos_token_ids
        self.param = param
        self._bitmask = torch.zeros(
            (vocab_size + 31) // 32, dtype=torch.int32
        )  # [ceil(V / 32)]: bit i of word w = token 32w + i

    def _failed(self) -> GrammarFailed:
        """The matcher's error (a limit reached: llguidance's resource limits) as the request's fault."""
        return GrammarFailed(
            f"{self.param} cannot be enforced: the grammar reached a limit while sampling "
            f"({library_reason(self.matcher.get_error())}); simplify the schema",
            self.param,
        )

    def allowed(self) -> torch.Tensor:
        """[V] bool: the tokens the grammar allows next."""
        # llguidance writes the mask into our buffer (what llguidance.torch does, without importing torch.compile)
        self.matcher.unsafe_compute_mask_ptr(self._bitmask.data_ptr(), self._bitmask.numel() * 4)
        if self.matcher.is_error():
            raise self._failed()
        bits = np.unpackbits(self._bitmask.numpy().view(np.uint8), bitorder="little")[
            : self.vocab_size
        ]  # [V] 0/1
        return torch.from_numpy(bits.view(np.bool_))

    def apply(self, logits: torch.Tensor) -> None:
        allowed = self.allowed().to(logits.device)
        if not bool(
            allowed.any()
        ):  # the grammar has ended and the row goes on (a caller that ignores end-of-turn)
            allowed[self.eos_token_ids] = True
        width = min(self.vocab_size, logits.shape[-1])
        logits[:width].masked_fill_(~allowed[:width], float("-inf"))
        logits[width:] = float("-inf")  # the model's padding rows past the tokenizer's vocabulary

    def advance(self, token: int) -> None:
        if self.matcher.is_stopped():
            return
        if not self.matcher.consume_token(token):  # a token its own mask allowed: a limit was reached
            raise self._failed()


def allowed_mass_mismatch(
    logits: torch.Tensor, allowed: torch.Tensor, temperature: float = 1.0
) -> tuple[float, float]:
    """(k1, k3) of one masked draw: what `mismatch_k1_mean` / `mismatch_k3_mean` add for such a token.

    A token drawn from the masked distribution q = p * allowed / Z, with Z = sum of p over the
    allowed tokens (p = softmax(logits / T)), records log q(x) = log p(x) - log Z; the trainer
    recomputes log p(x). Their log-ratio d = log p - log q = log Z is the same for every allowed
    token, so the k1 estimate is -d = -log Z and the k3 estimate (Schulman's) is
    exp(d) - d - 1 = Z - log Z - 1; both are 0 exactly when the grammar allowed all the mass.

    >>> k1, k3 = allowed_mass_mismatch(torch.log(torch.tensor([0.5, 0.25, 0.25])), torch.tensor([True, True, False]))
    >>> round(k1, 4), round(k3, 4)
    (0.2877, 0.0377)
    """
    logp = torch.log_softmax(logits / temperature, dim=-1)
    d = float(torch.logsumexp(logp[allowed], dim=-1))  # log Z
    return -d, float(torch.exp(torch.tensor(d))) - d - 1.0
