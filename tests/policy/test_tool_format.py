"""Tool formats: rendering OpenAI tools/tool_calls into prompts and parsing calls back."""

from __future__ import annotations

import json

import pytest

from grooves.policy.tool_format import (
    SmolLM2ToolFormat,
    TemplateToolFormat,
    parse_tool_calls,
    tool_format_for,
)
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


def _calls(parsed):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]


def test_parses_a_list_of_calls():
    text = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]</tool_call>'
    parsed = parse_tool_calls(text, [WEATHER, TIME])
    assert _calls(parsed) == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert parsed.content is None
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in parsed.tool_calls)
    assert len({c["id"] for c in parsed.tool_calls}) == 2


def test_parses_a_single_object_and_keeps_surrounding_text():
    text = 'Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    parsed = parse_tool_calls(text, [WEATHER])
    assert _calls(parsed) == [("get_weather", {"city": "Oslo"})]
    assert parsed.content == "Let me check."


def test_two_blocks_and_an_unterminated_last_block():
    text = '<tool_call>[{"name": "get_time"}]</tool_call> and <tool_call>[{"name": "get_weather", "arguments": {"city": "Rome"}}]'
    parsed = parse_tool_calls(text, [WEATHER, TIME])
    assert _calls(parsed) == [("get_time", {}), ("get_weather", {"city": "Rome"})]
    assert parsed.content == "and"


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>[{"name": "delete_everything", "arguments": {}}]</tool_call>',  # undeclared tool
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"</tool_call>',  # broken JSON
        "<tool_call>[]</tool_call>",  # an empty call list
        '<tool_call>["get_weather"]</tool_call>',  # not an object
    ],
)
def test_a_block_that_is_not_a_valid_call_stays_in_the_content(text):
    parsed = parse_tool_calls(text, [WEATHER])
    assert parsed.tool_calls == []
    assert parsed.content == text


def test_without_tools_nothing_is_parsed():
    text = '<tool_call>[{"name": "get_weather", "arguments": {}}]</tool_call>'
    assert parse_tool_calls(text, None).tool_calls == []
    assert parse_tool_calls(text, None).content == text


def test_string_arguments_pass_through_unchanged():
    parsed = parse_tool_calls(
        '<tool_call>[{"name": "get_weather", "arguments": "{\\"city\\": \\"Lima\\"}"}]</tool_call>', [WEATHER]
    )
    assert parsed.tool_calls[0]["function"]["arguments"] == '{"city": "Lima"}'


def test_smollm2_puts_tools_in_a_new_system_message():
    messages = [{"role": "user", "content": "weather?"}]
    out, native = SmolLM2ToolFormat().template_messages(messages, [WEATHER])
    assert native is None
    assert [m["role"] for m in out] == ["system", "user"]
    system = out[0]["content"]
    assert system.startswith("You are an expert in composing functions.")
    assert "<tools>" + json.dumps([WEATHER["function"]]) + "</tools>" in system
    assert system.endswith(
        '<tool_call>[{"name": "func_name1", "arguments": {"argument1": "value1"}}]</tool_call>'
    )


def test_smollm2_appends_tools_to_an_existing_system_message_and_renders_calls():
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "weather "}, {"type": "text", "text": "in Paris?"}],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    out, _ = SmolLM2ToolFormat().template_messages(messages, [WEATHER])
    assert out[0]["content"].startswith("Be brief.\n\nYou are an expert in composing functions.")
    assert out[1] == {"role": "user", "content": "weather in Paris?"}
    assert out[2] == {
        "role": "assistant",
        "content": '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>',
    }
    assert out[3] == {"role": "tool", "content": "sunny"}


def test_smollm2_rendered_call_parses_back_to_the_same_call():
    call = {
        "id": "c",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Kyiv"}'},
    }
    out, _ = SmolLM2ToolFormat().template_messages(
        [{"role": "assistant", "content": "", "tool_calls": [call]}], None
    )
    parsed = SmolLM2ToolFormat().parse(out[0]["content"], [WEATHER])
    assert _calls(parsed) == [("get_weather", {"city": "Kyiv"})]


def test_smollm2_format_through_the_chat_template():
    tok = build_tiny_tokenizer()
    msgs, tools = SmolLM2ToolFormat().template_messages([{"role": "user", "content": "hi"}], [TIME])
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are an expert in composing functions.")
    assert text.endswith("</tool_call><|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_template_format_hands_tools_to_the_template_with_decoded_arguments():
    messages = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        }
    ]
    out, tools = TemplateToolFormat().template_messages(messages, [WEATHER])
    assert tools == [WEATHER]
    assert out[0]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert (
        messages[0]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    )  # input left untouched


def test_choosing_a_format():
    assert isinstance(tool_format_for("template", None), TemplateToolFormat)
    assert isinstance(tool_format_for("smollm2", "{% if tools %}{% endif %}"), SmolLM2ToolFormat)
    assert isinstance(tool_format_for(None, "{% for tool in tools %}{% endfor %}"), TemplateToolFormat)
    assert isinstance(tool_format_for(None, build_tiny_tokenizer().chat_template), SmolLM2ToolFormat)
    with pytest.raises(
        ValueError, match=r"tool_format 'hermes' is unknown; choose one of \['smollm2', 'template'\]"
    ):
        tool_format_for("hermes", None)
