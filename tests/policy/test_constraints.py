"""Constrained decoding: JSON and forced tool calls always parse and validate; logprobs are the masked distribution's."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from grooves.core.loss import compute_loss
from grooves.policy.constraints import (
    ConstraintError,
    GrammarCompiler,
    allowed_mass_mismatch,
    request_grammar,
)
from grooves.policy.sampling import SamplingParams
from grooves.policy.tool_calls import HermesSyntax, Llama3JsonSyntax, SmolLM2Syntax
from grooves.policy.transformers import TransformersPolicy

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 10},
        "score": {"type": "integer"},
        "ok": {"type": "boolean"},
    },
    "required": ["answer", "score", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TransformersPolicy(str(tiny_model_dir), served_name="tiny")


def sample(policy, n=8, max_tokens=120, temperature=1.0, tools=None, **request):
    constraint = policy.prompts.constraint_for(tools=tools, **request)
    prompt = policy.prompts.render([{"role": "user", "content": "hello"}], tools)
    params = SamplingParams(
        n=n, max_tokens=max_tokens, temperature=temperature, seed=7, constraint=constraint
    )
    return prompt, policy.generate([prompt], [params])[0]


def finished(completions):
    done = [c for c in completions if c.finish_reason == "stop"]
    assert len(done) >= len(completions) // 2, [c.text for c in completions]  # most end before max_tokens
    return done


def is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def test_json_object_output_always_parses(policy):
    _, completions = sample(policy, response_format={"type": "json_object"})
    for c in finished(completions):
        assert isinstance(json.loads(c.text), dict), c.text
    # the tiny random model left alone writes no JSON at all
    prompt = policy.prompts.render([{"role": "user", "content": "hello"}], None)
    free = policy.generate([prompt], [SamplingParams(n=8, max_tokens=30, seed=7)])[0]
    assert not any(is_json_object(c.text) for c in free)


def test_json_schema_output_validates(policy):
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}}
    _, completions = sample(policy, response_format=fmt)
    for c in finished(completions):
        jsonschema.validate(json.loads(c.text), SCHEMA)
        assert c.text.startswith('{"answer": ')  # one line, json.dumps' separators, the schema's order


def test_tool_choice_required_gives_calls_whose_arguments_validate(policy):
    _, completions = sample(policy, tools=[WEATHER, TIME], tool_choice="required")
    for c in finished(completions):
        parsed = policy.prompts.parse(c.text, [WEATHER, TIME])
        assert parsed.tool_calls and parsed.content is None and parsed.unparsed == []
        for call in parsed.tool_calls:
            if call["function"]["name"] == "get_weather":
                jsonschema.validate(
                    json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"]
                )


def test_a_named_function_is_called_exactly_once(policy):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    _, completions = sample(policy, tools=[TIME, WEATHER], tool_choice=choice)
    for c in finished(completions):
        (call,) = policy.prompts.parse(c.text, [TIME, WEATHER]).tool_calls
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])


@pytest.mark.parametrize(
    "syntax,text,bad",
    [
        (
            SmolLM2Syntax(),
            '<tool_call>[{"name": "get_time", "arguments": {}}]</tool_call>',
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        ),
        (
            HermesSyntax(),
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
            '<tool_call>[{"name": "get_time", "arguments": {}}]</tool_call>',
        ),
        (
            Llama3JsonSyntax(),
            '{"name": "get_time", "parameters": {}}',
            '{"name": "get_time", "arguments": {}}',
        ),
    ],
    ids=["smollm2", "hermes", "llama3_json"],
)
def test_each_syntax_forces_its_own_call_format(policy, syntax, text, bad):
    grammar = request_grammar(syntax, tools=[TIME], tool_choice="required")
    assert accepts(policy, grammar, text) and not accepts(policy, grammar, bad)
    assert syntax.parse(text, [TIME]).tool_calls  # what the grammar forces, the syntax reads back


def accepts(policy, grammar, text: str) -> bool:
    """Whether `grammar` lets `text` (as the tokenizer splits it) through to its end of turn."""
    tok = policy.tokenizer
    mask = GrammarCompiler(tok, policy.prompts.eos_token_ids).compile(grammar)()
    for t in tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]:
        if not bool(mask.allowed()[t]):
            return False
        mask.advance(t)
    return True


def smollm2_call(name: str, arguments: dict) -> str:
    return "<tool_call>" + json.dumps([{"name": name, "arguments": arguments}]) + "</tool_call>"


NOW = {"type": "function", "function": {"name": "now", "description": "Current time."}}
OPEN_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "extra": {"type": "object"}},
            "required": ["city"],
        },
    },
}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "now"}}])
def test_a_forced_call_takes_only_the_keys_its_tool_declares(policy, choice):
    grammar = request_grammar(SmolLM2Syntax(), tools=[NOW, OPEN_WEATHER], tool_choice=choice)
    # before: the prompt's example argument passed, and smolagents refused the call
    assert not accepts(policy, grammar, smollm2_call("now", {"argument1": "text1"}))
    assert accepts(policy, grammar, smollm2_call("now", {}))
    if choice == "required":
        assert not accepts(policy, grammar, smollm2_call("get_weather", {"city": "Oslo", "days": 2}))
        # a declared free-form object stays free-form
        assert accepts(policy, grammar, smollm2_call("get_weather", {"city": "Oslo", "extra": {"k": 1}}))


def test_a_tool_whose_schema_has_defs_can_be_forced(policy):
    person = {  # as pydantic writes a nested model
        "$defs": {
            "Person": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
        },
        "type": "object",
        "properties": {"who": {"$ref": "#/$defs/Person"}},
        "required": ["who"],
    }
    tool = {"type": "function", "function": {"name": "greet", "parameters": person}}
    for syntax, text in [
        (SmolLM2Syntax(), smollm2_call("greet", {"who": {"name": "Ada"}})),
        (
            HermesSyntax(),
            '<tool_call>\n{"name": "greet", "arguments": {"who": {"name": "Ada"}}}\n</tool_call>',
        ),
    ]:
        # before: "failed to compile JSON schema: Pointer '/$defs/Person' does not exist"
        grammar = request_grammar(syntax, tools=[TIME, tool], tool_choice="required")
        assert accepts(policy, grammar, text)
        assert not accepts(policy, grammar, text.replace('"name": "Ada"', '"name": 7'))


@pytest.mark.parametrize(
    "syntax,one,two,text_then_call",
    [
        (
            SmolLM2Syntax(),
            smollm2_call("get_time", {}),
            '<tool_call>[{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}]</tool_call>',
            "Sure. " + smollm2_call("get_time", {}),
        ),
        (
            HermesSyntax(),
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
            'Sure. <tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        ),
        (
            Llama3JsonSyntax(),
            '{"name": "get_time", "parameters": {}}',
            '{"name": "get_time", "parameters": {}}; {"name": "get_time", "parameters": {}}',
            ' {"name": "get_time", "parameters": {}}',
        ),
    ],
    ids=["smollm2", "hermes", "llama3_json"],
)
def test_parallel_tool_calls_false_under_auto_is_text_or_one_call(policy, syntax, one, two, text_then_call):
    grammar = request_grammar(syntax, tools=[TIME], tool_choice="auto", parallel_tool_calls=False)
    assert grammar.param == "parallel_tool_calls"
    for text in ("The time is 5.", "", one):
        assert accepts(policy, grammar, text), text
    for text in (two, text_then_call):
        assert not accepts(policy, grammar, text), text
    # with parallel calls allowed, "auto" imposes nothing
    assert request_grammar(syntax, tools=[TIME], tool_choice="auto") is None


def test_logprobs_are_the_masked_distributions_and_the_trainer_sees_the_difference(policy):
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}}
    prompt, completions = sample(policy, n=2, max_tokens=40, temperature=0.8, response_format=fmt)
    constraint = policy.prompts.constraint_for(response_format=fmt)
    for c in completions:
        with torch.no_grad():
            logits = (
                policy.model(input_ids=torch.tensor([prompt + c.token_ids]))
                .logits[0, len(prompt) - 1 : -1]
                .float()
            )
        mask, masked, plain, k3 = constraint(), [], [], []
        for t, tok in enumerate(c.token_ids):
            allowed = mask.allowed()
            z = logits[t].masked_fill(~allowed, float("-inf"))
            masked.append(float(torch.log_softmax(z / 0.8, dim=-1)[tok]))
            plain.append(float(torch.log_softmax(logits[t] / 0.8, dim=-1)[tok]))
            k3.append(allowed_mass_mismatch(logits[t], allowed, 0.8)[1])
            if t + 1 < len(c.token_ids):
                mask.advance(tok)
        assert torch.tensor(c.logprobs).sub(torch.tensor(masked)).abs().max().item() < 1e-4
        # the trainer recomputes `plain`: its mismatch_k3_mean is the mean of Z - log Z - 1 over the tokens
        lp, lp_old = torch.tensor([plain]), torch.tensor([c.logprobs])
        ones = torch.ones_like(lp, dtype=torch.bool)
        _, stats = compute_loss(
            lp,
            lp_old,
            torch.ones(1),
            ones,
            torch.zeros_like(lp, dtype=torch.long),
            policy_loss="ppo",
            eps_low=0.2,
            eps_high=0.28,
            aggregation="token_mean",
            max_completion_tokens=40,
        )
        assert stats["mismatch_k3_mean"] == pytest.approx(sum(k3) / len(k3), rel=1e-3, abs=1e-6)
        assert stats["mismatch_k3_mean"] > 0.01  # a grammar moves real mass: visible, not noise


BAD = {
    "unknown type": (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            }
        },
        "response_format.json_schema.schema",
        "Invalid type: nonsense",
    ),
    "dangling $ref": (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"$ref": "#/defs/nope"}},
            }
        },
        "response_format.json_schema.schema",
        "Pointer '/defs/nope' does not exist",
    ),
    "unimplemented keyword, strict": (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "strict": True,
                    "schema": {"type": "array", "uniqueItems": True},
                },
            }
        },
        "response_format.json_schema.schema",
        'Unimplemented keys: ["uniqueItems"]',
    ),
    "tool schema": (
        {
            "tools": [
                TIME,
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "strict": True,
                        "parameters": {"type": "object", "dependentRequired": {"a": ["b"]}},
                    },
                },
            ],
            "tool_choice": "required",
        },
        "tools[1].function.parameters",
        'Unimplemented keys: ["dependentRequired"]',
    ),
    "named tool not declared": (
        {"tools": [TIME], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        "tool_choice.function.name",
        "not in tools",
    ),
    "required without tools": ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    "unknown response_format": (
        {"response_format": {"type": "yaml"}},
        "response_format.type",
        "'yaml' is unknown",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_what_cannot_be_compiled_names_the_field_and_the_librarys_reason(policy, case):
    request, param, reason = BAD[case]
    with pytest.raises(ConstraintError) as info:
        policy.prompts.constraint_for(**request)
    assert info.value.param == param
    assert reason in str(info.value)
    assert "start: %json" not in str(info.value)  # our generated grammar text is not echoed


def test_without_strict_unimplemented_keywords_are_ignored(policy):
    fmt = {
        "type": "json_schema",
        "json_schema": {
            "name": "x",
            "schema": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
        },
    }
    _, completions = sample(policy, n=4, max_tokens=60, response_format=fmt)
    for c in completions:
        if c.finish_reason == "stop":
            assert all(isinstance(v, int) for v in json.loads(c.text))


def test_text_and_auto_impose_nothing(policy):
    assert policy.prompts.constraint_for(response_format={"type": "text"}) is None
    assert policy.prompts.constraint_for(tools=[TIME], tool_choice="auto") is None
    assert policy.prompts.constraint_for() is None


def test_a_row_that_goes_on_after_its_grammar_ended_can_only_repeat_end_of_turn(policy):
    tok = policy.tokenizer
    mask = policy.prompts.constraint_for(response_format={"type": "json_object"})()
    for t in tok("{}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]:
        mask.advance(t)
    logits = torch.zeros(policy.model.config.vocab_size)
    mask.apply(logits)
    assert torch.isfinite(logits).nonzero().flatten().tolist() == sorted(policy.prompts.eos_token_ids)
    mask.advance(tok.eos_token_id)  # no error: the ended grammar ignores it
