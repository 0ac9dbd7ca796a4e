"""Reading a drafted rubric, and the interview's requests against a scripted judge.

A draft wrapped in prose or fences, with `[criteria.x]` tables or names with spaces, is repaired without
asking; anything else is sent back once with the loader's exact complaint, and a second invalid
draft is a `DraftError`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from grooves.judge import Criterion, Rubric
from grooves.judge.draft import InvalidDraft, parse_draft
from grooves.judge.interview import MARKER, TOPICS, DraftError, Interview, TaskContext, Turn
from scripted_judge import ScriptedServer, Verbatim, make_client

DRAFT = """instructions = "Name the capital."

[[criteria]]
name = "correct"
text = "Is the capital right?"
weight = 2
choices = ["no", "yes"]
"""


@pytest.mark.parametrize(
    "reply",
    [
        DRAFT,
        f"Here is the rubric you asked for:\n\n```toml\n{DRAFT}```\nI hope it helps.",
        f"Sure.\n{DRAFT}\nLet me know if you want changes.",
        DRAFT.replace('[[criteria]]\nname = "correct"', "[criteria.correct]"),
        json.dumps(
            {
                "instructions": "Name the capital.",
                "criteria": [
                    {
                        "name": "correct",
                        "text": "Is the capital right?",
                        "weight": 2,
                        "choices": ["no", "yes"],
                    }
                ],
            }
        ),
    ],
    ids=["plain", "fenced with prose", "prose around", "criteria tables", "JSON"],
)
def test_drafts_are_repaired_without_asking(reply):
    rubric = parse_draft(reply, "capitals")
    assert rubric == Rubric(
        name="capitals",
        version="1",
        instructions="Name the capital.",
        criteria=[Criterion(name="correct", text="Is the capital right?", weight=2.0, choices=["no", "yes"])],
    )


def test_the_model_cannot_name_or_version_the_rubric_and_names_become_keys():
    rubric = parse_draft(
        'name = "mine"\nversion = "9"\n' + DRAFT.replace('"correct"', '"Correct capital!"'), "qa"
    )
    assert (rubric.name, rubric.version, rubric.criteria[0].name) == ("qa", "1", "Correct_capital")


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ("", "the reply is empty; reply with the rubric as TOML"),
        (
            "A great answer names the capital.",
            "the reply holds no TOML (no `key = value` line, no [[criteria]] table); reply with the rubric as TOML",
        ),
        (
            DRAFT.replace("weight = 2", "weight = 0"),
            "the draft: criteria.0.weight: Value error, weight must be > 0",
        ),
        (
            DRAFT.replace('text = "Is the capital right?"\n', ""),
            "the draft: criteria.0.text: required field is missing",
        ),
        ('instructions = "x"', "the draft: criteria: required field is missing"),
        (
            DRAFT + DRAFT.split("\n\n", 1)[1],
            "the draft: rubric: Value error, criteria names must be unique; repeated: correct",
        ),
        (
            '[[criteria]]\nname = "a"\ntext = "a"\nchoices = "no, yes"',
            "the draft: criteria.0.choices: Input should be a valid list",
        ),
    ],
    ids=["empty", "prose", "weight 0", "no text", "no criteria", "repeated names", "choices as text"],
)
def test_invalid_drafts_say_what_to_fix(reply, problem):
    with pytest.raises(InvalidDraft) as info:
        parse_draft(reply, "qa")
    assert str(info.value).startswith(problem), str(info.value)


def _interview(server: ScriptedServer, tmp_path: Path, questions: int = 3) -> Interview:
    context = TaskContext(
        "Name a country's capital.", scenarios=['{"country": "Peru"}'], samples=["input: q\noutput: a"]
    )
    return Interview(make_client(server, tmp_path), context, questions=questions)


def test_questions_carry_the_task_the_answers_and_the_next_topic(tmp_path):
    with ScriptedServer(["What makes a great answer?", ""]) as server:
        interview = _interview(server, tmp_path)

        async def go():
            try:
                first = await interview.question([])
                second = await interview.question([Turn(first, "The right city, one line.")])
                return first, second
            finally:
                await interview.client.aclose()

        first, second = asyncio.run(go())
    assert first == "What makes a great answer?"
    assert second == TOPICS[1]  # an empty reply is replaced by the topic's wording
    body = server.requests[1]
    system = body["messages"][0]["content"]
    assert system.startswith(MARKER) and "up to 3 questions" in system
    assert "Name a country's capital." in system and '1. {"country": "Peru"}' in system
    assert "Responses from a training run:\n1. input: q\noutput: a" in system
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    assert body["messages"][3]["content"].startswith(
        "My answer: The right city, one line.\n\nAsk question 2 of at most 3."
    )
    assert TOPICS[1] in body["messages"][3]["content"]
    assert body["max_tokens"] == 200


def test_a_draft_is_sent_back_once_with_the_problem(tmp_path):
    bad = DRAFT.replace("weight = 2", "weight = 0")
    with ScriptedServer([bad, DRAFT]) as server:
        interview = _interview(server, tmp_path)
        seen: list[str] = []

        async def go():
            try:
                return await interview.draft(
                    [Turn("Q?", "A.")], "capitals", on_invalid=lambda reply, problem: seen.append(problem)
                )
            finally:
                await interview.client.aclose()

        draft = asyncio.run(go())
    assert draft.rubric.criteria[0].weight == 2.0 and draft.replies == [bad, DRAFT]
    assert seen == draft.problems and seen[0].startswith(
        "the draft: criteria.0.weight: Value error, weight must be > 0"
    )
    repair = server.requests[1]["messages"]
    assert repair[-2] == {"role": "assistant", "content": bad}
    assert repair[-1]["content"].startswith(
        f"That rubric cannot be used: {seen[0]}. Reply with the whole corrected rubric"
    )
    assert server.requests[1]["max_tokens"] == 1024


def test_a_second_invalid_draft_is_a_draft_error(tmp_path):
    with ScriptedServer(["no rubric here", Verbatim('{"criteria": []}')]) as server:
        interview = _interview(server, tmp_path)

        async def go():
            try:
                await interview.draft([Turn("Q?", "A.")], "capitals")
            finally:
                await interview.client.aclose()

        with pytest.raises(DraftError) as info:
            asyncio.run(go())
    assert len(server.requests) == 2
    assert str(info.value) == (
        "the judge model scripted-judge did not write a valid rubric, even after one repair "
        "(last problem: the draft: criteria: List should have at least 1 item after validation, not 0)"
    )
