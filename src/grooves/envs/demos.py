"""Demonstrations: an environment's gold solver played through real episodes, written as chats.

A small model that never calls a tool gets no reward, so RL has nothing to move. The usual way
out is a supervised warm start on demonstrations; these come from the environment itself. Each
train scenario is reset like a rollout, the gold solver makes its tool calls in the episode (real
tools, real results from the episode's own database), and the chat it leaves is graded by the
environment's grader. Only chats scoring 1.0 are kept: a demonstration teaches what the grader
rewards, never a near miss. A scenario whose solver raises is skipped; both are counted.

The chat is in the OpenAI format a rollout produces (system, user, assistant turns with
`tool_calls`, `tool` results, a final answer), so `grooves sft` renders it with the policy's own
chat template and tool format and lays it out token for token as the RL sampler records the same
conversation (tests/test_demos.py checks this on a real rollout). The wording varies: each tool
call is introduced by one of a few short `PREFACES` (or none) and each answer is one of the
solver's phrasings, drawn from a generator seeded by (seed, scenario, copy); the tool calls and
their arguments are what the episode needs and do not vary.

Demonstrations come from the train split only: validation and test scenarios stay unseen, so
they measure what was learned rather than what was shown.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grooves.envs.base import Environment, GraderError, Scenario
from grooves.envs.sqlite import play

PREFACES: tuple[str, ...] = ("", "Let me check.", "I'll look that up.", "One moment.")
"""Text before a tool call in the same assistant turn; "" is a bare call, as SmolLM2's tool
prompt asks for. Short, so a turn costs few extra tokens to sample."""


@dataclass
class DemoReport:
    """What `demonstrations` did: chats kept, and why the others were not."""

    env: str
    split: str
    scenarios: int
    written: int = 0
    dropped: list[str] = field(default_factory=list)
    """`scenario_id: score` for chats the grader scored below 1.0 (not written)."""
    skipped: list[str] = field(default_factory=list)
    """`scenario_id: error` for scenarios whose gold solver raised (nothing to write)."""

    def summary(self) -> str:
        return (
            f"{self.env}: {self.written} demonstrations from {self.scenarios} {self.split} scenarios; "
            f"dropped {len(self.dropped)} scoring below 1.0, skipped {len(self.skipped)} whose gold solver failed"
        )


def demonstrations(
    env: Environment,
    split: str = "train",
    *,
    seed: int = 0,
    copies: int = 1,
    prefaces: Sequence[str] = PREFACES,
    report: DemoReport | None = None,
) -> Iterator[dict[str, Any]]:
    """Chats `{"messages", "tools", "env", "scenario_id", "reward"}` that score 1.0, `copies` per
    scenario (each worded anew), in scenario order. `report` (if given) is filled in as they go."""
    if split != "train":
        raise ValueError(
            f"split {split!r}: demonstrations come from the train split only, so the "
            "validation and test scenarios stay unseen and measure what was learned"
        )
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    spec = getattr(env, "spec", None)
    if spec is None or not callable(getattr(spec, "gold", None)):
        raise ValueError(f"{env.name} has no gold solver to play (a local SqliteEnvironment has one)")
    scenarios = env.scenarios("train")
    report = report if report is not None else DemoReport(env.name, split, 0)
    report.scenarios = len(scenarios)
    for scenario in scenarios:
        for copy in range(copies):
            rng = random.Random(f"{seed}:{scenario['id']}:{copy}")
            chat, skipped, why = _demonstration(env, spec.gold, scenario, rng, prefaces)
            if chat is None:
                (report.skipped if skipped else report.dropped).append(f"{scenario['id']}: {why}")
                continue
            report.written += 1
            yield chat


def _demonstration(
    env: Environment, solver, scenario: Scenario, rng: random.Random, prefaces: Sequence[str]
) -> tuple[dict[str, Any] | None, bool, str]:
    """(chat, _, "") when the grader scores it 1.0; else (None, whether the solver failed, why)."""
    episode = env.reset(scenario)
    try:
        try:
            traj = play(episode, solver, scenario, rng=rng, prefaces=prefaces)
        except Exception as exc:  # a scripted solver's own failure (a lookup that found nothing): skip, count
            return None, True, f"{type(exc).__name__}: {exc}"
        try:
            grade = episode.grade(traj)
        except GraderError as exc:  # the grader's own failure on this chat: skip, count, say which
            return None, True, str(exc)
    finally:
        episode.close()
    if grade.score < 1.0:
        notes = f" ({'; '.join(grade.notes)})" if grade.notes else ""
        return None, False, f"scored {grade.score:.3f}{notes}"
    return (
        {
            "messages": traj.messages,
            "tools": traj.tools,
            "env": env.name,
            "scenario_id": scenario["id"],
            "reward": grade.score,
        },
        False,
        "",
    )


def write_demonstrations(
    env: Environment,
    path: str | Path,
    split: str = "train",
    *,
    seed: int = 0,
    copies: int = 1,
    prefaces: Sequence[str] = PREFACES,
) -> DemoReport:
    """Write `demonstrations(...)` to a JSONL file (one chat per line); returns the report.

    The file is written to `path.tmp` and renamed when complete, so a failed run leaves no
    half-written demonstrations behind; when no chat scores 1.0, nothing is written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    report = DemoReport(env.name, split, 0)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w") as f:
            for chat in demonstrations(
                env, split, seed=seed, copies=copies, prefaces=prefaces, report=report
            ):
                f.write(json.dumps(chat) + "\n")
        if report.written:
            tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return report
