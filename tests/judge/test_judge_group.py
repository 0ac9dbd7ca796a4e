"""Group and absolute judging through a real HTTP server: validation, repair, cache, shuffling, bias."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from grooves.core.trajectory import Trajectory, TrajectoryGroup
from grooves.judge import DEFAULT_RUBRIC, AbsoluteJudge, Criterion, GroupJudge, JudgeError, Rubric
from scripted_judge import ScriptedServer, group_reply, make_client, shown_responses, sign

QUESTION = {"role": "user", "content": "Name a number."}


def conversation(answer: str) -> list[dict]:
    return [QUESTION, {"role": "assistant", "content": answer}]


def value_in(text: str) -> float:
    """The judge's rule in these tests: an answer 'value 0.7' deserves 0.7."""
    return float(re.search(r"value (\d\.\d+)", text).group(1))


def fair_judge(body: dict) -> str:
    return group_reply({i: value_in(t) for i, t in shown_responses(body).items()})


@pytest.fixture
def server():
    with ScriptedServer() as s:
        yield s


def run(coro):
    return asyncio.run(coro)


async def judge_once(server, tmp_path, conversations, rubric=None, **kw):
    client = make_client(server, tmp_path)
    judge = GroupJudge(client, rubric or DEFAULT_RUBRIC, **kw)
    try:
        return await judge.judge_conversations(conversations), client
    finally:
        await client.aclose()


def test_shuffled_scores_map_back_to_their_trajectories(server, tmp_path):
    values = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    server.script.append(fair_judge)
    judgment, _ = run(judge_once(server, tmp_path, [conversation(f"value {v}") for v in values], seed=3))
    assert judgment.order != sorted(judgment.order)  # the judge did not see them in order
    shown = list(shown_responses(server.requests[0]).values())
    assert [value_in(t) for t in shown] == [values[i] for i in judgment.order]
    assert [s.total for s in judgment.scores] == values
    assert [s.reason for s in judgment.scores] == [f"scored {v}" for v in values]


def test_shared_context_is_shown_once(server, tmp_path):
    server.script.append(fair_judge)
    run(judge_once(server, tmp_path, [conversation("value 0.1"), conversation("value 0.9")]))
    user = server.requests[0]["messages"][1]["content"]
    assert user.count("Name a number.") == 1
    assert user.index("<context>") < user.index('<response id="t1">')


BAD_REPLIES = {
    "missing id": (
        json.dumps({"scores": [{"reason": "r", "criteria": {"overall": 0.5}}] * 3}),
        'has no "id"',
    ),
    "extra score": (group_reply({"t1": 0.1, "t2": 0.2, "t3": 0.3, "t4": 0.4}), "expected exactly 3 scores"),
    "7 out of range": (group_reply({"t1": 0.1, "t2": 7, "t3": 0.3}), "7 is out of range [0, 1]"),
    "not JSON": ("The first answer is best, I'd give it 8/10.", "not valid JSON"),
}


@pytest.mark.parametrize("kind", list(BAD_REPLIES))
def test_malformed_reply_is_repaired_on_one_retry(server, tmp_path, kind):
    bad, error = BAD_REPLIES[kind]
    server.script += [bad, fair_judge]
    judgment, _ = run(judge_once(server, tmp_path, [conversation(f"value 0.{k}") for k in (1, 2, 3)]))
    assert [s.total for s in judgment.scores] == [0.1, 0.2, 0.3]
    assert len(server.requests) == 2
    repair = server.requests[1]["messages"]
    assert repair[-2] == {"role": "assistant", "content": sign(bad, server.requests[0])}
    assert error in repair[-1]["content"]


@pytest.mark.parametrize("kind", list(BAD_REPLIES))
def test_malformed_twice_fails_with_judge_error(server, tmp_path, kind):
    bad, error = BAD_REPLIES[kind]
    server.script += [bad, bad]
    with pytest.raises(JudgeError, match=re.escape(error)):
        run(judge_once(server, tmp_path, [conversation(f"value 0.{k}") for k in (1, 2, 3)]))
    assert len(server.requests) == 2


def test_code_fences_and_prose_are_tolerated(server, tmp_path):
    server.script.append(
        lambda body: "Here is my judgment:\n```json\n" + sign(fair_judge(body), body) + "\n```\n"
    )
    judgment, _ = run(judge_once(server, tmp_path, [conversation("value 0.4"), conversation("value 0.8")]))
    assert [s.total for s in judgment.scores] == [0.4, 0.8]
    assert len(server.requests) == 1


def test_cache_serves_an_identical_call_without_a_request(server, tmp_path):
    convs = [conversation("value 0.3"), conversation("value 0.7")]
    server.script.append(fair_judge)
    first, c1 = run(judge_once(server, tmp_path, convs))
    second, c2 = run(judge_once(server, tmp_path, convs))  # a new client, same cache file
    assert len(server.requests) == 1
    assert (c2.usage.requests, c2.usage.cache_hits, c2.usage.prompt_tokens) == (0, 1, 0)
    assert second.scores == first.scores
    server.script.append(fair_judge)
    run(judge_once(server, tmp_path, convs, seed=1))  # another order is another request
    assert len(server.requests) == 2


def test_invalid_replies_are_not_cached(server, tmp_path):
    convs = [conversation("value 0.3"), conversation("value 0.7")]
    server.script += ["nope", "nope"]
    with pytest.raises(JudgeError):
        run(judge_once(server, tmp_path, convs))
    server.script.append(fair_judge)
    judgment, _ = run(judge_once(server, tmp_path, convs))
    assert [s.total for s in judgment.scores] == [0.3, 0.7]
    assert len(server.requests) == 3


def first_shown_bonus(body: dict) -> str:
    """A judge with position bias: whatever is shown first gets +0.3."""
    return group_reply(
        {i: value_in(t) + (0.3 if i == "t1" else 0.0) for i, t in shown_responses(body).items()}
    )


def test_judge_twice_reverses_order_and_measures_position_bias(server, tmp_path):
    values = [0.2, 0.5, 0.4]
    server.script += [first_shown_bonus, first_shown_bonus]
    judgment, client = run(
        judge_once(server, tmp_path, [conversation(f"value {v}") for v in values], judge_twice=True)
    )
    assert len(server.requests) == 2
    orders = [[value_in(t) for t in shown_responses(b).values()] for b in server.requests]
    assert orders[1] == orders[0][::-1]
    first, last = judgment.order[0], judgment.order[-1]
    # the first-shown and last-shown items each got +0.3 in one of the two passes: |diff| 0.3, 0.3, 0
    assert judgment.position_bias == pytest.approx(0.2)
    for i, score in enumerate(judgment.scores):
        bonus = 0.15 if i in (first, last) else 0.0
        assert score.total == pytest.approx(values[i] + bonus)
        assert score.position_bias == pytest.approx(0.3 if i in (first, last) else 0.0)
    assert client.usage.requests == 2


RUBRIC = Rubric(
    name="qa",
    version="2",
    criteria=[
        Criterion(name="correct", text="Is it right?", weight=3.0, choices=["no", "partly", "yes"]),
        Criterion(name="concise", text="Is it short?", weight=1.0),
    ],
)


def test_per_criterion_scores_give_the_weighted_total(server, tmp_path):
    reply = {
        "scores": [
            {"id": "t1", "reason": "right but wordy", "criteria": {"correct": "yes", "concise": 0.2}},
            {"id": "t2", "reason": "half right, short", "criteria": {"correct": "Partly", "concise": 1.0}},
        ]
    }
    server.script.append(json.dumps(reply))
    judgment, _ = run(judge_once(server, tmp_path, [conversation("a"), conversation("b")], rubric=RUBRIC))
    by_reason = {s.reason: s for s in judgment.scores}
    s1, s2 = by_reason["right but wordy"], by_reason["half right, short"]
    assert s1.criteria == {"correct": 1.0, "concise": 0.2}
    assert s1.total == pytest.approx((3 * 1.0 + 0.2) / 4)
    assert s2.total == pytest.approx((3 * 0.5 + 1.0) / 4)
    assert (s1.rubric, s1.rubric_version, s1.rubric_hash, s1.judge_model) == (
        "qa",
        "2",
        RUBRIC.content_hash,
        "scripted-judge",
    )
    system = server.requests[0]["messages"][0]["content"]
    assert '"correct" (weight 3): Is it right? Answer one of "no", "partly", "yes"' in system
    assert system.index('"reason"') < system.index('"criteria"')  # reason before verdict


def test_unknown_choice_label_is_sent_back_for_repair(server, tmp_path):
    bad = {"scores": [{"id": "t1", "reason": "r", "criteria": {"correct": "maybe", "concise": 0.5}}]}
    good = {"scores": [{"id": "t1", "reason": "r", "criteria": {"correct": "no", "concise": 0.5}}]}
    server.script += [json.dumps(bad), json.dumps(good)]
    judgment, _ = run(judge_once(server, tmp_path, [conversation("a")], rubric=RUBRIC))
    assert "'maybe' is not one of ['no', 'partly', 'yes']" in server.requests[1]["messages"][-1]["content"]
    assert judgment.scores[0].total == pytest.approx(0.5 / 4)


def test_judge_group_scores_only_successful_trajectories(server, tmp_path):
    group = TrajectoryGroup(
        trajectories=[
            Trajectory(messages=conversation("value 0.9")),
            Trajectory(error="ToolError: boom"),
            Trajectory(messages=conversation("value 0.1")),
        ]
    )
    server.script.append(fair_judge)

    async def go():
        client = make_client(server, tmp_path)
        out = await GroupJudge(client).judge_group(group)
        await client.aclose()
        return out

    judgment = run(go())
    assert [s.total for s in judgment.scores] == [0.9, 0.1]
    assert len(shown_responses(server.requests[0])) == 2


def test_absolute_mode_scores_one_output_and_repairs(server, tmp_path):
    server.script += ['{"criteria": {"overall": 0.5}}', '{"reason": "fine", "criteria": {"overall": 0.75}}']

    async def go():
        client = make_client(server, tmp_path)
        score = await AbsoluteJudge(client).judge_text("What is 2+2?", "4")
        usage = client.take_usage()
        again = await AbsoluteJudge(client).judge_text("What is 2+2?", "4")
        await client.aclose()
        return score, again, usage, client.take_usage()

    score, again, usage, later = run(go())
    assert (score.total, score.reason, score.mode) == (0.75, "fine", "absolute")
    assert 'needs a "reason" string' in server.requests[1]["messages"][-1]["content"]
    assert again == score
    assert (usage.requests, later.requests, later.cache_hits) == (2, 0, 1)
    assert usage.prompt_tokens > 0 and usage.completion_tokens == (3 + 2) + (
        5 + 2
    )  # "nonce": "..." is 2 words
