"""The rubric interview: a judge model asks what good looks like, one question at a time, then drafts a rubric.

The person knows the task; the model knows how rubrics are written. The conversation is rebuilt
from the answered turns for every request: one system message (the task, a few of its scenarios,
a few outputs from a run), then for each turn a user message that asks for the next question and
the model's question. Each request names a topic the interview should cover by then, in this
order (`TOPICS`): what separates a great response from a poor one, what must never happen, the
common failure, edge cases, what matters most, and what would look good without being good. A
model that follows them tailors each question to the task and the earlier answers; a question it
leaves empty is replaced by the topic's own wording.

After the last answer the model is asked for the rubric in grooves' TOML format (`DRAFT_FORMAT`):
weighted criteria with ordered choices (the scale), and each thing that must never happen as a
gate criterion. `draft.parse_draft` tidies and checks the reply; a draft that is still invalid
is sent back once with the loader's exact complaint, and a second invalid draft raises
`DraftError`. A rubric is never handed out broken.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from grooves.judge.draft import InvalidDraft, parse_draft
from grooves.judge.endpoint import JudgeClient
from grooves.judge.errors import JudgeError
from grooves.judge.rubric import Rubric

MARKER = "You are interviewing a person to write a rubric"
"""How the system message of every interview request begins (test and stand-in servers look for it)."""

TOPICS = (
    "What does a great response to this task do that a poor one does not?",
    "What must a response never do, however good the rest of it is?",
    "What is the most common way responses to this task go wrong?",
    "Which edge cases or unusual inputs matter, and what should a response do with them?",
    "Of the qualities you named, which matters most, and how much more than the others?",
    "How could a response look good to a quick reader without actually being good?",
)
"""The interview's topics, in the order it covers them; the last repeats when there are more questions."""

QUESTION_TOKENS = 200
"""Room for one question; a longer reply is cut there (the draft gets the judge's max_tokens)."""

DRAFT_FORMAT = """Write the rubric now, from my answers. Reply with TOML only, in exactly this format:

instructions = "What the task is and what a great response does, in two or three sentences."

[[criteria]]
name = "correct"
text = "Is the answer right?"
weight = 2.0
choices = ["no", "partly", "yes"]

[[criteria]]
name = "no_invention"
text = "Does the response avoid inventing facts?"
choices = ["no", "yes"]
gate = true

Rules:
- one [[criteria]] table per quality I named, 2 to 6 in all; `text` is one question about a single response;
- `weight` is how much the quality counts: a number above 0, the largest for what matters most;
- `choices` is the scale, worst first;
- each thing that must never happen is a criterion with choices = ["no", "yes"] and gate = true: its "no" scores the whole response 0;
- `name` uses only letters, digits, _ and -; every name once."""


class DraftError(JudgeError):
    """The model did not produce a valid rubric, even after one repair; the message says what was wrong."""


@dataclass
class TaskContext:
    """What the model is told about the task before its first question."""

    description: str
    """The task in words: what the person typed, or a task's name and what it asks."""
    scenarios: list[str] = field(default_factory=list)
    """A few scenarios of the task's train split, as text."""
    samples: list[str] = field(default_factory=list)
    """A few outputs from a run, as text (input and output)."""

    def system_message(self, questions: int) -> str:
        parts = [
            f"{MARKER}: the instructions and criteria an LLM judge will use to score a model's responses "
            "to a task, as the reward in reinforcement learning. The person knows the task; you know how "
            f"rubrics are written. You may ask up to {questions} questions, one per turn, each short "
            "and about this task: what separates a great response from a poor one, what must never "
            "happen, what the common failure looks like, which edge cases matter. Build on the earlier "
            "answers. Do not answer your own questions, and do not write the rubric until you are asked.",
            f"The task:\n{self.description}",
        ]
        if self.scenarios:
            parts.append("Scenarios from its training split:\n" + _numbered(self.scenarios))
        if self.samples:
            parts.append("Responses from a training run:\n" + _numbered(self.samples))
        return "\n\n".join(parts)


def _numbered(texts: Sequence[str]) -> str:
    return "\n".join(f"{k}. {t}" for k, t in enumerate(texts, start=1))


@dataclass(frozen=True)
class Turn:
    question: str
    answer: str


@dataclass
class Draft:
    """A valid drafted rubric and the replies it took (the first, and the repaired one if any)."""

    rubric: Rubric
    replies: list[str]
    problems: list[str]
    """Why each reply before the last was sent back (empty when the first draft was valid)."""


Notice = Callable[[str, str], None]
"""Called with (a draft reply, what is wrong with it) before that draft is sent back for repair."""


class Interview:
    """One interview with one judge model; `question` and `draft` are its two requests."""

    def __init__(self, client: JudgeClient, context: TaskContext, *, questions: int = 6) -> None:
        if questions < 1:
            raise ValueError(f"questions must be at least 1, got {questions}")
        self.client = client
        self.context = context
        self.questions = questions

    def _messages(self, turns: Sequence[Turn], last: str) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self.context.system_message(self.questions)}]
        pending = ""
        for k, turn in enumerate(turns):
            messages.append({"role": "user", "content": pending + self._ask(k)})
            messages.append({"role": "assistant", "content": turn.question})
            pending = f"My answer: {turn.answer}\n\n"
        messages.append({"role": "user", "content": pending + last})
        return messages

    def _ask(self, k: int) -> str:
        topic = TOPICS[min(k, len(TOPICS) - 1)]
        return (
            f"Ask question {k + 1} of at most {self.questions}. If the earlier questions have not "
            f"covered it, ask this, in words that fit the task: {topic} Reply with the question only."
        )

    async def question(self, turns: Sequence[Turn]) -> str:
        """The model's next question, given the turns answered so far (the topic's wording if it sends none)."""
        reply = await self.client.complete(
            self._messages(turns, self._ask(len(turns))), max_tokens=QUESTION_TOKENS
        )
        return reply.text.strip() or TOPICS[min(len(turns), len(TOPICS) - 1)]

    async def draft(self, turns: Sequence[Turn], name: str, *, on_invalid: Notice | None = None) -> Draft:
        """The rubric, named `name`, drafted from the answers; repaired once, else `DraftError`."""
        messages = self._messages(turns, DRAFT_FORMAT)
        replies: list[str] = []
        problems: list[str] = []
        for attempt in range(2):
            reply = (await self.client.complete(messages)).text
            replies.append(reply)
            try:
                return Draft(parse_draft(reply, name), replies, problems)
            except InvalidDraft as exc:
                problems.append(str(exc))
                if on_invalid is not None:
                    on_invalid(reply, str(exc))
                if attempt == 0:
                    messages += [
                        {"role": "assistant", "content": reply},
                        {
                            "role": "user",
                            "content": f"That rubric cannot be used: {exc}. Reply with the whole "
                            "corrected rubric, as TOML only, in the format above.",
                        },
                    ]
        raise DraftError(
            f"the judge model {self.client.model} did not write a valid rubric, even after one repair "
            f"(last problem: {problems[-1]})"
        )
