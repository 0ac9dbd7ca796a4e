"""Group-relative judging: score the N outputs of one group side by side (RULER-like).

RULER (OpenPipe, 2025) observed that an LLM judge ranks a group of attempts at the same task far
more consistently than it scores each alone, and GRPO only needs relative rewards within a group.
This judge goes further than RULER's reference code:

- the reply is validated (exactly N scores, ids match, values in range) and repaired once, then the
  judgment fails with `JudgeError`, which the caller counts and drops the group for;
- the display order is shuffled with a seeded RNG (one permutation per group, reproducible, so
  reruns hit the cache) and scores are mapped back, so the policy cannot learn "be first";
- optionally the group is judged twice, the second time in reversed order; the two totals are
  averaged and their mean absolute difference is reported as the judge's position bias;
- scores are per criterion of a structured rubric, with a weighted total.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from grooves.core.trajectory import TrajectoryGroup
from grooves.judge.agreement import mean_abs_diff
from grooves.judge.ask import ask
from grooves.judge.cache import cache_key
from grooves.judge.endpoint import JudgeClient
from grooves.judge.prompt import group_messages, render_messages, shown_texts, split_shared_context
from grooves.judge.rubric import DEFAULT_RUBRIC, Rubric
from grooves.judge.score import GroupJudgment, Score
from grooves.judge.verdict import ItemVerdict, parse_group


def display_ids(n: int) -> list[str]:
    """Neutral ids in display order: t1..tn."""
    return [f"t{k + 1}" for k in range(n)]


def _average(a: ItemVerdict, b: ItemVerdict) -> ItemVerdict:
    criteria = {k: (a.criteria[k] + b.criteria[k]) / 2 for k in a.criteria}
    return ItemVerdict(reason=a.reason, criteria=criteria, total=(a.total + b.total) / 2)


class GroupJudge:
    """Judges groups of outputs that answer the same context under one rubric."""

    def __init__(
        self,
        client: JudgeClient,
        rubric: Rubric = DEFAULT_RUBRIC,
        *,
        seed: int = 0,
        judge_twice: bool = False,
    ) -> None:
        self.client = client
        self.rubric = rubric
        self.seed = seed
        self.judge_twice = judge_twice
        """Judge again in reversed order: twice the cost, averages away position bias and measures it."""

    def order_for(self, conversations: Sequence[Sequence[dict[str, Any]]]) -> list[int]:
        """The seeded display permutation for these conversations (stable across runs)."""
        order = list(range(len(conversations)))
        random.Random(f"{self.seed}:{cache_key(conversations)}").shuffle(order)
        return order

    async def _judge_in_order(
        self, context: str, texts: Sequence[str], order: list[int]
    ) -> list[ItemVerdict]:
        """Judge texts shown in `order`; return verdicts indexed like `texts`."""
        ids = display_ids(len(texts))
        shown = [texts[i] for i in order]
        messages = group_messages(self.rubric, context, shown, ids)
        key = self.client.key(self.rubric.content_hash, {"mode": "group", "messages": messages})
        by_id = await ask(
            self.client,
            messages,
            shown_texts(context, shown),
            lambda reply, seal: parse_group(reply, ids, self.rubric, seal),
            key,
        )
        verdicts: list[ItemVerdict | None] = [None] * len(texts)
        for position, original in enumerate(order):
            verdicts[original] = by_id[ids[position]]
        assert all(v is not None for v in verdicts)
        return [v for v in verdicts if v is not None]

    async def judge_conversations(self, conversations: Sequence[Sequence[dict[str, Any]]]) -> GroupJudgment:
        """Score each conversation (message list) against the others; raises JudgeError on failure."""
        if not conversations:
            return GroupJudgment(scores=[], order=[])
        prefix, rests = split_shared_context(conversations)
        context = render_messages(prefix) if prefix else "(no shared context)"
        texts = [render_messages(r) for r in rests]
        order = self.order_for(conversations)
        if not self.judge_twice:
            verdicts = await self._judge_in_order(context, texts, order)
            scores = [Score.from_verdict(v, self.rubric, self.client.model, "group") for v in verdicts]
            return GroupJudgment(scores=scores, order=order)
        first, second = await asyncio.gather(
            self._judge_in_order(context, texts, order),
            self._judge_in_order(context, texts, order[::-1]),
        )
        scores = []
        for a, b in zip(first, second, strict=True):
            score = Score.from_verdict(_average(a, b), self.rubric, self.client.model, "group")
            score.position_bias = abs(a.total - b.total)
            scores.append(score)
        bias = mean_abs_diff([v.total for v in first], [v.total for v in second])
        return GroupJudgment(scores=scores, order=order, position_bias=bias)

    async def judge_group(self, group: TrajectoryGroup) -> GroupJudgment:
        """Score the group's successful trajectories; scores follow `group.ok` order."""
        return await self.judge_conversations([t.messages for t in group.ok])
