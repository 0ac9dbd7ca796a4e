"""Streamed text pieces: never taken back, never a broken character or a stop string, joined they are the completion's text."""

from __future__ import annotations

import pytest

from grooves.policy.sampling import SamplingParams
from grooves.policy.text_stream import TextStream
from grooves.policy.transformers import TransformersPolicy


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TransformersPolicy(str(tiny_model_dir), served_name="tiny")


def stream_all(policy, completion, stop=None):
    stream = TextStream(policy.tokenizer, policy.prompts.eos_token_ids, stop)
    pieces = [stream.feed([t]) for t in completion.token_ids]
    pieces.append(stream.finish(completion.text))
    return pieces


def test_pieces_join_to_the_completion_text(policy):
    prompt = policy.prompts.render([{"role": "user", "content": "a story"}], None)
    for c in policy.generate([prompt], [SamplingParams(n=4, max_tokens=40, seed=3)])[0]:
        pieces = stream_all(policy, c)
        assert "".join(pieces) == c.text
        assert "\ufffd" not in "".join(pieces[:-1]) or "\ufffd" in c.text


def test_a_character_split_across_tokens_waits_for_its_last_byte(policy):
    tok = policy.tokenizer
    ids = tok("é ok", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids[:1]) == "\ufffd"  # the byte-level tokenizer splits é into two byte tokens
    stream = TextStream(tok, policy.prompts.eos_token_ids)
    assert stream.feed(ids[:1]) == ""
    assert "".join(stream.feed([t]) for t in ids[1:]) == "é ok"


def test_text_that_may_start_a_stop_string_is_held_and_the_stop_string_is_never_sent(policy):
    tok = policy.tokenizer
    stream = TextStream(tok, policy.prompts.eos_token_ids, stop=["world"])
    sent = ""
    for t in tok("hello wor", add_special_tokens=False)["input_ids"]:
        sent += stream.feed([t])
    assert sent == "hello "  # "wor" may become "world"
    for t in tok("ld and more", add_special_tokens=False)["input_ids"]:
        sent += stream.feed([t])
    assert sent == "hello "
    assert stream.finish("hello ") == ""
    other = TextStream(tok, policy.prompts.eos_token_ids, stop=["world"])
    text = "".join(other.feed([t]) for t in tok("hello wonder", add_special_tokens=False)["input_ids"])
    assert text == "hello wonder"  # "wo" went out once it could no longer become "world"


def test_stop_strings_through_the_sampler(policy):
    prompt = policy.prompts.render([{"role": "user", "content": "hello world"}], None)
    for c in policy.generate([prompt], [SamplingParams(n=6, max_tokens=40, seed=1, stop=["e", "o"])])[0]:
        pieces = stream_all(policy, c, ["e", "o"])
        assert "".join(pieces) == c.text and "e" not in c.text and "o" not in c.text
