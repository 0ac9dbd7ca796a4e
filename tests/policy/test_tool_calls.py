"""Tool-call parsing per syntax: calls read whole, nothing lost, what does not parse kept as text and counted."""

from __future__ import annotations

import json
import logging

import pytest

from grooves.policy.tool_calls import (
    CallStream,
    DeclaredSyntax,
    HermesSyntax,
    Llama3JsonSyntax,
    SmolLM2Syntax,
    syntax_for_template,
)
from grooves.policy.tool_format import SmolLM2ToolFormat, TemplateToolFormat, tool_format_for
from grooves.policy.transformers import TransformersPolicy
from tiny_models import build_tiny_tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
TOOLS = [WEATHER, TIME]


def calls(parsed):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]


# ---- Hermes / Qwen: one <tool_call> block per call ------------------------------------------


@pytest.mark.parametrize("key", ["arguments", "parameters"])
def test_hermes_reads_arguments_under_either_key(key):
    text = f'<tool_call>\n{{"name": "get_weather", "{key}": {{"city": "Paris"}}}}\n</tool_call>'
    parsed = HermesSyntax().parse(text, TOOLS)
    # before: `parameters` parsed as a call with arguments {} and the city was lost
    assert calls(parsed) == [("get_weather", {"city": "Paris"})]
    assert parsed.content is None and parsed.unparsed == []


def test_hermes_two_blocks_with_text_between_and_string_arguments():
    text = (
        'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    parsed = HermesSyntax().parse(text, TOOLS)
    assert calls(parsed) == [("get_weather", {"city": "Oslo"}), ("get_time", {})]
    assert parsed.content == "Checking."


MALFORMED = {
    "broken JSON": (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"</tool_call>',
        "not valid JSON",
    ),
    "undeclared tool": (
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
        "'rm_rf' is not one of the request's tools",
    ),
    "arguments a list": (
        '<tool_call>{"name": "get_weather", "arguments": ["Paris"]}</tool_call>',
        "arguments must be a JSON object, got list",
    ),
    "arguments a non-JSON string": (
        '<tool_call>{"name": "get_weather", "arguments": "Paris"}</tool_call>',
        "arguments are a string that is not JSON",
    ),
    "both keys, different": (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "A"}, "parameters": {"city": "B"}}</tool_call>',
        "both 'arguments' and 'parameters'",
    ),
    "arguments at the top level": (
        '<tool_call>{"name": "get_weather", "city": "Paris"}</tool_call>',
        "unknown keys ['city']",
    ),
    "no name": ('<tool_call>{"arguments": {"city": "Paris"}}</tool_call>', "no string 'name'"),
    "empty list": ("<tool_call>[]</tool_call>", "an empty list of calls"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("syntax", [HermesSyntax(), SmolLM2Syntax()], ids=["hermes", "smollm2"])
def test_a_tagged_call_that_does_not_parse_stays_in_the_content_with_its_reason(syntax, case):
    text, reason = MALFORMED[case]
    parsed = syntax.parse("Sure. " + text, TOOLS)
    assert parsed.tool_calls == []
    assert parsed.content == "Sure. " + text  # every byte the model wrote
    assert len(parsed.unparsed) == 1 and parsed.unparsed[0].text == text
    assert reason in parsed.unparsed[0].reason


def test_a_good_block_next_to_a_bad_one_keeps_both():
    bad = '<tool_call>{"name": "get_weather", "arguments": {</tool_call>'
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>' + bad
    parsed = HermesSyntax().parse(text, TOOLS)
    assert calls(parsed) == [("get_time", {})]
    assert parsed.content == bad and [u.text for u in parsed.unparsed] == [bad]


# ---- SmolLM2: a JSON list in one block -----------------------------------------------------


def test_smollm2_list_and_single_object():
    text = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "get_time", "parameters": {}}]</tool_call>'
    assert calls(SmolLM2Syntax().parse(text, TOOLS)) == [("get_weather", {"city": "Rome"}), ("get_time", {})]
    one = '<tool_call>{"name": "get_weather", "arguments": {"city": "Kyiv"}}</tool_call>'
    assert calls(SmolLM2Syntax().parse(one, TOOLS)) == [("get_weather", {"city": "Kyiv"})]


def test_smollm2_list_with_one_bad_call_is_kept_whole():
    text = '<tool_call>[{"name": "get_time", "arguments": {}}, {"name": "nope", "arguments": {}}]</tool_call>'
    parsed = SmolLM2Syntax().parse(text, TOOLS)
    assert parsed.tool_calls == [] and parsed.content == text
    assert "'nope' is not one of the request's tools" in parsed.unparsed[0].reason


def test_text_without_a_call_is_content_and_not_counted():
    for syntax in (SmolLM2Syntax(), HermesSyntax(), Llama3JsonSyntax()):
        parsed = syntax.parse('The answer is {"city": "Paris"}.', TOOLS)
        assert (
            parsed.tool_calls == []
            and parsed.unparsed == []
            and parsed.content == 'The answer is {"city": "Paris"}.'
        )
        assert (
            syntax.parse('<tool_call>{"name": "get_time"}</tool_call>', None).tool_calls == []
        )  # no tools: no calls


# ---- Llama 3.1 JSON: the whole answer, bare or after <|python_tag|> ----------------------------


@pytest.mark.parametrize("prefix", ["", "<|python_tag|>", "  \n"])
def test_llama3_json_bare_or_after_python_tag(prefix):
    text = prefix + '{"name": "get_weather", "parameters": {"city": "Lima"}}'
    parsed = Llama3JsonSyntax().parse(text, TOOLS)
    assert calls(parsed) == [("get_weather", {"city": "Lima"})]
    assert parsed.content is None and parsed.unparsed == []


def test_llama3_json_several_calls_separated_by_semicolons():
    text = '{"name": "get_weather", "parameters": {"city": "a;b"}}; {"name": "get_time", "parameters": {}}'
    assert calls(Llama3JsonSyntax().parse(text, TOOLS)) == [
        ("get_weather", {"city": "a;b"}),
        ("get_time", {}),
    ]


@pytest.mark.parametrize(
    "text,reason",
    [
        ('{"name": "get_weather", "parameters": {"city": "Lima"', "not valid JSON"),
        ('<|python_tag|>{"name": "launch", "parameters": {}}', "'launch' is not one of the request's tools"),
        ('{"name": "get_weather", "parameters": "Lima"}', "arguments are a string that is not JSON"),
    ],
)
def test_llama3_json_that_does_not_parse_is_kept_and_counted(text, reason):
    parsed = Llama3JsonSyntax().parse(text, TOOLS)
    assert parsed.tool_calls == [] and parsed.content == text
    assert len(parsed.unparsed) == 1 and reason in parsed.unparsed[0].reason


# ---- what the chat template declares ---------------------------------------------------------

QWEN_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open_pattern": r"\s*<tool_call>",
            "close": "</tool_call>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"\s*(?:<\|im_end\|>)", "content": "text"},
    },
}


@pytest.fixture()
def declared_tokenizer():
    tok = build_tiny_tokenizer()
    tok.response_template = QWEN_RESPONSE_TEMPLATE
    return tok


def test_a_declared_response_template_is_read_by_transformers(declared_tokenizer):
    syntax = DeclaredSyntax(declared_tokenizer, HermesSyntax())
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Quito"}}\n</tool_call>'
    parsed = syntax.parse(text, TOOLS)
    assert calls(parsed) == [("get_weather", {"city": "Quito"})]
    assert parsed.content == "Let me look."


def test_a_declared_template_that_cannot_read_a_call_falls_back_and_keeps_it(declared_tokenizer):
    syntax = DeclaredSyntax(declared_tokenizer, HermesSyntax())
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'
    parsed = syntax.parse(text, TOOLS)
    assert parsed.tool_calls == [] and parsed.content == text and len(parsed.unparsed) == 1
    # transformers reads `parameters` into the call unchanged; the fallback check catches nothing lost
    ok = syntax.parse('<tool_call>{"name": "get_weather", "parameters": {"city": "Bern"}}</tool_call>', TOOLS)
    assert calls(ok) == [("get_weather", {"city": "Bern"})]


def test_choosing_the_syntax_from_the_template(declared_tokenizer):
    llama31 = "{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }} <|python_tag|> {% for t in tools %}{% endfor %}"
    assert isinstance(syntax_for_template(llama31), Llama3JsonSyntax)
    assert isinstance(syntax_for_template("{% for t in tools %}<tool_call>{% endfor %}"), HermesSyntax)
    assert isinstance(tool_format_for(None, llama31).syntax, Llama3JsonSyntax)
    assert isinstance(tool_format_for(None, build_tiny_tokenizer().chat_template).syntax, SmolLM2Syntax)
    declared = tool_format_for("template", "{% for t in tools %}{% endfor %}", declared_tokenizer)
    assert isinstance(declared, TemplateToolFormat) and isinstance(declared.syntax, DeclaredSyntax)
    assert isinstance(SmolLM2ToolFormat().syntax, SmolLM2Syntax)


def test_the_policy_counts_and_logs_calls_kept_as_text(tiny_model_dir, caplog):
    policy = TransformersPolicy(str(tiny_model_dir), served_name="tiny")
    good = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>'
    bad = '<tool_call>[{"name": "get_weather", "parameters": {"city": "Paris"</tool_call>'
    with caplog.at_level(logging.WARNING, logger="grooves.policy"):
        assert len(policy.prompts.parse(good, TOOLS).tool_calls) == 1
        assert policy.prompts.parse(bad, TOOLS).content == bad
    assert (policy.prompts.tool_calls.parsed, policy.prompts.tool_calls.unparsed) == (1, 1)
    assert [r.getMessage() for r in caplog.records] == [
        f"tool call kept as text (not valid JSON (Expecting ',' delimiter at character 55)): {bad!r}"
    ]


# ---- streaming: content at once, calls once whole, the same result as parsing the whole text ----

STREAMED = [
    (
        SmolLM2Syntax(),
        'Let me see. <tool_call>[{"name": "get_weather", "arguments": {"city": "Rome"}}]</tool_call>',
    ),
    (SmolLM2Syntax(), "Plain answer with a < sign and <tool_c but no call."),
    (SmolLM2Syntax(), '<tool_call>[{"name": "nope", "arguments": {}}]</tool_call> then text'),
    (
        HermesSyntax(),
        'A\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "parameters": {"city": "Oslo"}}\n</tool_call>',
    ),
    (HermesSyntax(), 'unclosed <tool_call>{"name": "get_time", "arguments": {}}'),
    (Llama3JsonSyntax(), '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Lima"}}'),
    (Llama3JsonSyntax(), '{"city": "Lima"} is what I think'),
    (Llama3JsonSyntax(), "Just words."),
]


@pytest.mark.parametrize("chunk", [1, 3, 7])
@pytest.mark.parametrize("case", range(len(STREAMED)))
def test_a_streamed_parse_agrees_with_the_whole_parse(case, chunk):
    syntax, text = STREAMED[case]
    stream = CallStream(syntax, TOOLS)
    content, streamed_calls, held_back = "", [], []
    for i in range(0, len(text), chunk):
        piece, found = stream.feed(text[i : i + chunk])
        content += piece
        streamed_calls += found
        held_back.append(len(text[: i + chunk]) - len(content))
    piece, found, whole = stream.finish()
    content += piece
    streamed_calls += found
    assert (content.strip() or None) == whole.content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in streamed_calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in whole.tool_calls
    ]
    if not whole.tool_calls and not whole.unparsed and syntax.name != "llama3_json":
        assert max(held_back) < len("<tool_call>")  # plain text is not held back beyond a possible tag


def test_a_declared_template_streams_its_text_at_the_end(declared_tokenizer):
    stream = CallStream(DeclaredSyntax(declared_tokenizer, HermesSyntax()), TOOLS)
    assert stream.feed("Hello ") == ("", [])
    content, found, whole = stream.finish()
    assert content == "Hello " and found == [] and whole.content == "Hello "


# ---- a text cut at max_tokens inside a call: the call as far as written, no markup in content ----

CUT = [
    # (syntax, text cut at max_tokens, content, calls as (name, arguments text), how the last was cut)
    (
        SmolLM2Syntax(),
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Par',
        None,
        [("get_weather", '{"city": "Par')],
        "partial",
    ),
    (
        SmolLM2Syntax(),
        'On it. <tool_call>[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"ci',
        "On it.",
        [("get_time", "{}"), ("get_weather", '{"ci')],
        "partial",
    ),
    (SmolLM2Syntax(), '<tool_call>[{"name": "get_weather", ', None, [("get_weather", "")], "partial"),
    (SmolLM2Syntax(), '<tool_call>[{"name": "get_wea', None, [], "nameless"),
    (SmolLM2Syntax(), "Let me see <tool_ca", "Let me see", [], "nameless"),
    (
        SmolLM2Syntax(),
        '<tool_call>[{"name": "get_time", "arguments": {}}]</tool_',
        None,
        [("get_time", "{}")],
        "whole",
    ),
    (
        HermesSyntax(),
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Os',
        None,
        [("get_time", "{}"), ("get_weather", '{"city": "Os')],
        "partial",
    ),
    (
        Llama3JsonSyntax(),
        '<|python_tag|>{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"city": "Li',
        None,
        [("get_time", "{}"), ("get_weather", '{"city": "Li')],
        "partial",
    ),
]


@pytest.mark.parametrize("case", range(len(CUT)))
def test_a_call_cut_at_max_tokens_is_read_as_far_as_written(case):
    syntax, text, content, want, last = CUT[case]
    parsed = syntax.parse_cut(text, TOOLS)
    # before: the whole block stayed in the content, as markup, with no tool_calls
    assert parsed.content == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.tool_calls] == want
    assert parsed.cut is not None and parsed.cut.last == last and parsed.unparsed == []
    for chunk in (1, 4):  # streamed in pieces, the same content and calls
        stream = CallStream(syntax, TOOLS)
        sent, streamed_calls = "", []
        for i in range(0, len(text), chunk):
            piece, found = stream.feed(text[i : i + chunk])
            sent, streamed_calls = sent + piece, streamed_calls + found
        piece, found, _ = stream.finish(cut=True)
        assert ((sent + piece).strip() or None) == content
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in streamed_calls + found] == want


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>not json at all",
        '<tool_call>[{"name": "func_name1", "arguments": {"argument1": "val',
        '<tool_call>[{"name": "get_time", "arguments": {}}, {"name": "nope", "arguments": {',
    ],
)
def test_a_cut_block_that_is_no_call_stays_text(text):
    parsed = SmolLM2Syntax().parse_cut(text, TOOLS)
    assert parsed.content == text and parsed.tool_calls == [] and parsed.cut is None
    assert len(parsed.unparsed) == 1


def test_the_policy_counts_and_logs_a_call_cut_at_max_tokens(tiny_model_dir, caplog):
    policy = TransformersPolicy(str(tiny_model_dir), served_name="tiny")
    text = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Par'
    with caplog.at_level(logging.WARNING, logger="grooves.policy"):
        parsed = policy.prompts.parse(text, TOOLS, cut=True)
    assert parsed.content is None and len(parsed.tool_calls) == 1
    counters = policy.prompts.tool_calls
    assert (counters.parsed, counters.unparsed, counters.cut) == (1, 0, 1)
    assert [r.getMessage() for r in caplog.records] == [
        f"tool call cut at max_tokens (returned with its arguments as far as written): {text!r}"
    ]


# ---- a string argument that holds the tags themselves: blocks are read by their JSON ----

TAGS_IN_ARGUMENTS = [
    (
        SmolLM2Syntax(),
        'Sure. <tool_call>[{"name": "get_weather", "arguments": {"city": "a </tool_call> b <tool_call> c"}}]</tool_call>',
        "Sure.",
        [("get_weather", {"city": "a </tool_call> b <tool_call> c"})],
    ),
    (
        HermesSyntax(),
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "<tool_call>x</tool_call>"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call> done',
        "done",
        [("get_weather", {"city": "<tool_call>x</tool_call>"}), ("get_time", {})],
    ),
    (  # arguments as a JSON string, the tags inside its escaped JSON
        HermesSyntax(),
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"</tool_call><tool_call>\\"}"}</tool_call>',
        None,
        [("get_weather", {"city": "</tool_call><tool_call>"})],
    ),
]


@pytest.mark.parametrize("case", range(len(TAGS_IN_ARGUMENTS)))
def test_a_call_whose_string_argument_holds_the_tags_is_read_whole_streamed_or_not(case):
    syntax, text, content, want = TAGS_IN_ARGUMENTS[case]
    parsed = syntax.parse(text, TOOLS)
    # before: the first </tool_call> inside the string ended the block, and the call stayed in content as markup
    assert calls(parsed) == want
    assert parsed.content == content and parsed.unparsed == []
    for chunk in (1, 5, len(text)):
        stream = CallStream(syntax, TOOLS)
        sent, streamed_calls = "", []
        for i in range(0, len(text), chunk):
            piece, found = stream.feed(text[i : i + chunk])
            sent, streamed_calls = sent + piece, streamed_calls + found
            assert "<tool_call>" not in sent  # no markup goes out as content on the way
        piece, found, _ = stream.finish()
        assert ((sent + piece).strip() or None) == content
        assert [
            (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in streamed_calls + found
        ] == want


def test_a_call_cut_inside_a_string_argument_that_holds_the_tags_is_read_as_far_as_written():
    text = '<tool_call>[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "x</tool_call> <tool_call>y'
    parsed = SmolLM2Syntax().parse_cut(text, TOOLS)
    assert parsed.content is None and parsed.unparsed == []
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in parsed.tool_calls] == [
        ("get_time", "{}"),
        ("get_weather", '{"city": "x</tool_call> <tool_call>y'),
    ]
    assert parsed.cut is not None and parsed.cut.last == "partial"
    stream = CallStream(SmolLM2Syntax(), TOOLS)
    sent = "".join(stream.feed(text[i : i + 3])[0] for i in range(0, len(text), 3))
    piece, found, _ = stream.finish(cut=True)
    assert (sent + piece).strip() == "" and [c["function"]["name"] for c in found] == [
        "get_time",
        "get_weather",
    ]


def test_a_block_that_is_no_json_still_ends_at_its_first_closing_tag():
    bad = '<tool_call>{"name": "get_time", "arguments": {}</tool_call>'
    text = bad + ' then <tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    parsed = HermesSyntax().parse(text, TOOLS)
    assert calls(parsed) == [("get_time", {})]
    assert [u.text for u in parsed.unparsed] == [bad] and parsed.content == bad + " then"
    stream = CallStream(HermesSyntax(), TOOLS)
    sent, streamed_calls = "", []
    for i in range(0, len(text), 4):
        piece, found = stream.feed(text[i : i + 4])
        sent, streamed_calls = sent + piece, streamed_calls + found
        if i + 4 >= len(bad):
            assert sent.startswith(bad)  # the bad block goes out once its closing tag settles it
    piece, found, _ = stream.finish()
    assert (sent + piece).strip() == bad + " then" and len(streamed_calls + found) == 1
