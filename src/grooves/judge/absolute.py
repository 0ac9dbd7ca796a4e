"""Absolute judging: each output scored alone against the rubric.

For single outputs (a calibration batch of unrelated items, a gate such as "every claim is
supported by the input") there is no group to compare against. The request, validation, repair
and cache are the same as in group mode; only the prompt and the reply shape differ. A group is
judged as N independent requests run concurrently under the client's limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from grooves.core.trajectory import TrajectoryGroup
from grooves.judge.ask import ask
from grooves.judge.endpoint import JudgeClient
from grooves.judge.prompt import render_messages, shown_texts, single_messages, split_shared_context
from grooves.judge.rubric import DEFAULT_RUBRIC, Rubric
from grooves.judge.score import GroupJudgment, Score
from grooves.judge.verdict import parse_single


class AbsoluteJudge:
    """Judges one output at a time under one rubric."""

    def __init__(self, client: JudgeClient, rubric: Rubric = DEFAULT_RUBRIC) -> None:
        self.client = client
        self.rubric = rubric

    async def judge_text(self, context: str, response: str) -> Score:
        """Score `response` to `context`; raises JudgeError when the judge fails for good."""
        messages = single_messages(self.rubric, context, response)
        key = self.client.key(self.rubric.content_hash, {"mode": "absolute", "messages": messages})
        verdict = await ask(
            self.client,
            messages,
            shown_texts(context, [response]),
            lambda reply, seal: parse_single(reply, self.rubric, seal),
            key,
        )
        return Score.from_verdict(verdict, self.rubric, self.client.model, "absolute")

    async def judge_conversation(self, messages: Sequence[dict[str, Any]]) -> Score:
        """Score one conversation: everything from its first assistant message on is the response."""
        (prefix, [rest]) = split_shared_context([messages])
        return await self.judge_text(render_messages(prefix) or "(no context)", render_messages(rest))

    async def judge_group(self, group: TrajectoryGroup) -> GroupJudgment:
        """Score each successful trajectory independently; scores follow `group.ok` order."""
        ok = group.ok
        scores = await asyncio.gather(*(self.judge_conversation(t.messages) for t in ok))
        return GroupJudgment(scores=list(scores), order=list(range(len(ok))))
