"""The environment contract: scenarios, per-rollout episodes, tool steps, grades and limits.

An `Environment` is the task definition and is shared by every concurrent rollout; it holds no
rollout state. `reset(scenario)` opens an `Episode`, which owns one rollout's state (its own
SQLite database and clock), so concurrent rollouts never share anything mutable. This follows
verifiers' split between a stateless environment and a per-rollout state object, but makes the
state an object with methods so a remote episode (over HTTP) can stand in for a local one.

The contract is synchronous on purpose: local steps are microsecond SQLite calls, and the
rollout loop runs them in a worker thread so a slow or remote step never blocks other rollouts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

Split = Literal["train", "validation", "test"]
SPLITS: tuple[Split, ...] = ("train", "validation", "test")
"""train: what a run samples and demonstrations come from; validation: what a run scores itself on
between steps (so choices of learning rate or step count are tuned against it); test: held out
from both, for a final measurement that no choice was tuned on. An environment may leave a split
empty."""

Scenario = dict[str, Any]
"""One task instance: at least `id`, `env`, `split` and `prompt`; `expected` holds what the
grader checks against (the agent sees only the messages `reset` builds from `prompt`)."""

GOLD_KEYS: tuple[str, ...] = ("expected",)
"""Scenario fields that hold the grader's answers: never handed to an agent or a remote client."""


def public_scenario(scenario: Scenario) -> Scenario:
    """The scenario without its answers, as the environment server lists it.

    >>> public_scenario({"id": "t-001", "prompt": "What is 2 + 2?", "expected": {"answer": 4}})
    {'id': 't-001', 'prompt': 'What is 2 + 2?'}
    """
    return {k: v for k, v in scenario.items() if k not in GOLD_KEYS}


class Limits(BaseModel):
    """How long an episode may run before it is stopped and graded as it stands."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(default=10, ge=1)
    """Assistant turns (model calls) per episode. More turns let an agent recover from a bad
    tool call; fewer keep rollouts short and penalise aimless exploration."""
    latency_budget_s: float | None = Field(default=None, gt=0)
    """Seconds of tool latency an episode may spend; None means no budget. Once spent, tools
    answer with an error and the episode is done."""
    clock: Literal["simulated", "real"] = "simulated"
    """`simulated`: each tool call costs its declared latency (deterministic, reproducible, the
    default). `real`: the wall-clock time the tool took (what a production tool would cost)."""
    max_argument_chars: int = Field(default=8192, ge=16)
    """Tool-call arguments longer than this are refused before parsing (a huge-input guard)."""
    max_result_chars: int = Field(default=6000, ge=64)
    """Tool results are cut to this many characters so one call cannot flood the context."""


class Grade(BaseModel):
    """A score in [0, 1] and the parts it was made from (logged as separate reward signals)."""

    model_config = ConfigDict(extra="forbid")

    score: float = Field(ge=0.0, le=1.0)
    parts: dict[str, float] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    """Why points were lost, in words (for reading trajectories, never for training)."""


@dataclass(frozen=True)
class ToolCall:
    """A tool call as the model emitted it: `arguments` is the raw JSON text, unparsed."""

    id: str
    name: str
    arguments: str


def parse_tool_call(obj: Any) -> ToolCall:
    """Read an OpenAI-style tool call (a dict or the openai client's pydantic object).

    >>> parse_tool_call({"id": "c1", "type": "function",
    ...                  "function": {"name": "f", "arguments": '{"x": 1}'}})
    ToolCall(id='c1', name='f', arguments='{"x": 1}')
    """
    if isinstance(obj, ToolCall):
        return obj
    if hasattr(obj, "model_dump"):
        obj = obj.model_dump()
    if not isinstance(obj, dict):
        raise TypeError(f"a tool call must be a dict or an openai ToolCall, got {type(obj).__name__}")
    fn = obj.get("function") or {}
    if not isinstance(fn, dict):
        raise TypeError(
            f"tool_call.function must be an object with a name and arguments, got {type(fn).__name__}"
        )
    name, call_id = fn.get("name") or "", obj.get("id") or ""
    if not isinstance(name, str) or not isinstance(call_id, str | int):
        raise TypeError("tool_call.function.name must be a string, and tool_call.id a string or a number")
    args = fn.get("arguments", "")
    if not isinstance(args, str):
        # Some clients hand over parsed arguments; keep one representation (the JSON text).
        try:
            args = json.dumps(args)
        except (
            TypeError,
            ValueError,
            RecursionError,
        ) as exc:  # nested past the recursion limit, huge integers
            raise TypeError(
                f"tool_call.function.arguments cannot be written as JSON: {type(exc).__name__}"
            ) from None
    return ToolCall(id=str(call_id), name=name, arguments=args)


def final_answer(messages: list[dict[str, Any]]) -> str:
    """The agent's final answer: the last assistant message, if it called no tools.

    An episode that ended while the agent was still calling tools has no answer (""), so a
    grader cannot credit text the agent wrote alongside a tool call.
    """
    for m in reversed(messages):
        if m.get("role") == "assistant":
            if m.get("tool_calls"):
                return ""
            return str(m.get("content") or "")
    return ""


def tool_calls_made(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(tool name, parsed arguments) for every tool call in the chat, in order."""
    calls = []
    for m in messages:
        for raw in m.get("tool_calls") or []:
            call = parse_tool_call(raw)
            try:
                args = json.loads(call.arguments)
            except json.JSONDecodeError:
                args = {}
            calls.append((call.name, args if isinstance(args, dict) else {}))
    return calls


def as_messages(trajectory: Any) -> list[dict[str, Any]]:
    """Accept a Trajectory, anything with `.messages`, or a list of message dicts."""
    if isinstance(trajectory, list):
        return trajectory
    messages = getattr(trajectory, "messages", None)
    if isinstance(messages, list):
        return messages
    raise TypeError(f"cannot grade a {type(trajectory).__name__}: pass a Trajectory or a message list")


@runtime_checkable
class Episode(Protocol):
    """One rollout's session: its opening messages, tools and private state."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The opening chat (system + user) for this scenario."""
        ...

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools in OpenAI `tools` format."""
        ...

    @property
    def done(self) -> bool:
        """True once the latency budget is spent: further tool calls only return errors."""
        ...

    def step(self, tool_call: Any) -> dict[str, Any]:
        """Run one tool call; always returns a `{"role": "tool", ...}` message, never raises."""
        ...

    def grade(self, trajectory: Any) -> Grade: ...

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...

    def fork(self) -> Episode: ...

    def metrics(self) -> dict[str, float]: ...

    def close(self) -> None: ...


@runtime_checkable
class Environment(Protocol):
    """A task: scenarios in splits, episodes opened per rollout, and a grader it can prove."""

    @property
    def name(self) -> str: ...

    @property
    def limits(self) -> Limits: ...

    def scenarios(self, split: Split) -> list[Scenario]: ...

    def reset(self, scenario: Scenario) -> Episode: ...

    def validate(self) -> ValidationReport: ...


class GraderError(RuntimeError):
    """An environment's grader raised or returned something other than a grade; the message is one
    line naming the environment, the grader and the scenario. A rollout whose grading fails is a
    failed rollout (recorded, counted, not trained on), as any rollout that raises."""


def callable_name(fn: Any, fallback: str) -> str:
    """A function's name for messages: `fallback` for a lambda or an object without one.

    >>> callable_name(len, "x"), callable_name(lambda s, c: "", "bad[2]")
    ('len', 'bad[2]')
    """
    inner = getattr(fn, "func", fn)  # a functools.partial
    name = getattr(inner, "__name__", None)
    return name if isinstance(name, str) and name != "<lambda>" else fallback


class ValidationReport(BaseModel):
    """The grader's proof: gold solutions score 1.0 and known-bad ones low.

    `print(report)` (and its repr) is `summary()`: one verdict line, then a line per solver.
    """

    model_config = ConfigDict(extra="forbid")

    env: str
    scenarios: int
    gold_scores: list[float]
    bad_scores: list[float]
    bad_threshold: float
    failures: list[str] = Field(default_factory=list)
    gold_solver: str = "gold"
    """The gold solver's function name."""
    bad_solvers: dict[str, list[float]] = Field(default_factory=dict)
    """Each known-bad solver's scores, by name (its function's name; `empty answer` and `echo of
    the prompt` are the two every SQLite environment also plays), one per scenario it played."""

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        worst_gold = min(self.gold_scores, default=float("nan"))
        worst_bad = max(self.bad_scores, default=float("nan"))
        verdict = "ok" if self.ok else f"{len(self.failures)} failures"
        lines = [
            f"{self.env}: {self.scenarios} scenarios, min gold {worst_gold:.3f}, "
            f"max bad {worst_bad:.3f} (threshold {self.bad_threshold}): {verdict}"
        ]
        if self.gold_scores:
            full = sum(score >= 1.0 for score in self.gold_scores)
            lines.append(
                f"  gold solver {self.gold_solver}: 1.0 on {full} of {len(self.gold_scores)} scenarios "
                "(it must score 1.0 on every one)"
            )
        if self.bad_solvers:
            lines.append(f"  bad solvers, each must score <= {self.bad_threshold} on every scenario:")
            for name, scores in self.bad_solvers.items():
                over = sum(score > self.bad_threshold for score in scores)
                above = f", above {self.bad_threshold} on {over}" if over else ""
                lines.append(
                    f"    {name}: max {max(scores, default=float('nan')):.3f} over {len(scores)}{above}"
                )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        return self.summary()
