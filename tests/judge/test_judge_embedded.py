"""A judge served by grooves itself, in-process: the same client path as a hosted API."""

from __future__ import annotations

import asyncio

import pytest

from grooves.judge import AbsoluteJudge, Criterion, JudgeClient, JudgeConfig, JudgeError, Rubric
from grooves.policy.transformers import TransformersPolicy
from grooves.serve.app import inprocess_client

TINY_RUBRIC = Rubric(
    name="t", version="1", instructions="Judge.", criteria=[Criterion(name="ok", text="Ok?")]
)


def test_a_grooves_served_judge_is_called_and_its_unusable_replies_end_in_judge_error(
    tiny_model_dir, tmp_path
):
    policy = TransformersPolicy(str(tiny_model_dir), served_name="tiny")

    async def go():
        config = JudgeConfig(model="tiny", max_tokens=16, cache_path=tmp_path / "cache.sqlite")
        client = JudgeClient(config, openai_client=inprocess_client(policy))
        try:
            with pytest.raises(JudgeError, match="still invalid after one repair"):
                await AbsoluteJudge(client, TINY_RUBRIC).judge_text("2+2?", "4")
        finally:
            await client.aclose()
        return client.usage

    usage = asyncio.run(go())
    # a random tiny model cannot write the JSON: one request, one repair, nothing cached
    assert (usage.requests, usage.retries, usage.cache_hits) == (2, 0, 0)
    assert usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 32
