"""Batch scoring for the calibration loop: items in, one score record per item out.

Items come from a JSONL file of `{id, input, output}` objects, or from a run's trajectories
(JSONL of `TrajectoryGroup`s, one per line, or of single `Trajectory`s). Every record carries the
rubric's name, version and hash and the judge model, so score files made with different rubric
versions can be compared and never confused. A judgment that fails for good becomes a record with
`error` set and no score: it is reported, not fatal.

In group mode the items of one group are judged side by side: a run's groups as they were
sampled, and for `{id, input, output}` files the items that share the same input.

A batch never reports success over nothing: `Coverage` (scored items over all items) goes with
every mean, and after `stop_after` identical failures in a row the remaining items are not sent
(they are recorded as not judged), because a server that is down or a model name it does not know
fails every request the same way. Failures are not cached; `to_retry` and `merge` re-ask only
the failed items of an earlier scores file.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grooves.core.trajectory import Trajectory, TrajectoryGroup
from grooves.jsonl import read_models, write_models
from grooves.judge.absolute import AbsoluteJudge
from grooves.judge.endpoint import JudgeClient
from grooves.judge.errors import JudgeError
from grooves.judge.group import GroupJudge
from grooves.judge.prompt import conversation_pair
from grooves.judge.rubric import Rubric
from grooves.judge.score import JudgeMode, Score


class Item(BaseModel):
    """One output to score. `messages` (from a run) takes precedence over input/output text."""

    model_config = ConfigDict(extra="ignore")

    id: str
    input: str = ""
    output: str = ""
    group: str | None = None
    messages: list[dict[str, Any]] | None = None

    def conversation(self) -> list[dict[str, Any]]:
        if self.messages is not None:
            return self.messages
        return [{"role": "user", "content": self.input}, {"role": "assistant", "content": self.output}]


class ScoreRecord(BaseModel):
    """One line of a scores JSONL file."""

    model_config = ConfigDict(extra="forbid")

    id: str
    input: str
    output: str
    score: float | None
    """Weighted total in [0, 1]; None when judging failed (see `error`)."""
    criteria: dict[str, float] = Field(default_factory=dict)
    reason: str = ""
    error: str | None = None
    rubric: str
    rubric_version: str
    rubric_hash: str
    judge_model: str
    mode: JudgeMode
    group: str | None = None
    position_bias: float | None = None


def _from_trajectory(traj: Trajectory, item_id: str, group: str | None) -> Item:
    text_in, text_out = conversation_pair(traj.messages)
    return Item(id=item_id, input=text_in, output=text_out, group=group, messages=traj.messages)


def _items_from_line(data: dict[str, Any], lineno: int, path: Path) -> list[Item]:
    try:
        if "trajectories" in data:
            group = TrajectoryGroup.model_validate(data)
            gid = str(group.scenario.get("id", f"g{lineno}"))
            return [
                _from_trajectory(t, str(t.metadata.get("id", f"{gid}-{k}")), gid)
                for k, t in enumerate(group.trajectories)
                if t.error is None
            ]
        if "messages" in data:
            traj = Trajectory.model_validate(data)
            return [] if traj.error else [_from_trajectory(traj, str(traj.metadata.get("id", lineno)), None)]
        data.setdefault("id", str(lineno))
        data["id"] = str(data["id"])
        return [Item.model_validate(data)]
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ValueError(f"{path}:{lineno}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from exc


def read_items(path: str | Path) -> list[Item]:
    """Read items from `{id, input, output}` lines, trajectory-group lines, or trajectory lines."""
    path = Path(path)
    items: list[Item] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON: {exc}") from exc
            if not isinstance(data, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(data).__name__}")
            items.extend(_items_from_line(data, lineno, path))
    ids = [i.id for i in items]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"{path}: item ids must be unique; repeated: {', '.join(dupes[:5])}")
    return items


def _record(
    item: Item, score: Score | None, rubric: Rubric, model: str, mode: JudgeMode, error: str | None
) -> ScoreRecord:
    return ScoreRecord(
        id=item.id,
        input=item.input,
        output=item.output,
        score=None if score is None else score.total,
        criteria={} if score is None else score.criteria,
        reason="" if score is None else score.reason,
        error=error,
        rubric=rubric.name,
        rubric_version=rubric.version,
        rubric_hash=rubric.content_hash,
        judge_model=model,
        mode=mode,
        group=item.group,
        position_bias=None if score is None else score.position_bias,
    )


def _groups(items: Sequence[Item]) -> list[list[Item]]:
    by_key: dict[str, list[Item]] = {}
    for item in items:
        by_key.setdefault(item.group if item.group is not None else f"input:{item.input}", []).append(item)
    return list(by_key.values())


class Breaker:
    """Stops a batch after `limit` identical failures in a row (0: never stops)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.last: str | None = None
        self.repeats = 0
        self.tripped: str | None = None
        """The repeated error once the limit is reached; nothing is sent after that."""

    def record(self, error: str | None) -> None:
        if error is None:
            self.last, self.repeats = None, 0
            return
        self.repeats = self.repeats + 1 if error == self.last else 1
        self.last = error
        if self.limit and self.repeats >= self.limit and self.tripped is None:
            self.tripped = error

    def skipped(self) -> str:
        return f"not judged: stopped after {self.limit} identical failures in a row ({self.tripped})"


async def score_items(
    client: JudgeClient,
    rubric: Rubric,
    items: Sequence[Item],
    *,
    mode: JudgeMode = "absolute",
    judge_twice: bool = False,
    seed: int = 0,
    stop_after: int = 3,
) -> list[ScoreRecord]:
    """Score every item; records come back in item order.

    Items (absolute) or groups (group mode) are started at most `client.config.concurrency` at a
    time; once `stop_after` of them have failed in a row with the same error, the rest are recorded
    as not judged instead of being sent.
    """
    model = client.model
    breaker = Breaker(stop_after)
    gate = asyncio.Semaphore(client.config.concurrency)
    absolute = AbsoluteJudge(client, rubric)
    grouped = GroupJudge(client, rubric, seed=seed, judge_twice=judge_twice)

    async def unit(members: list[Item]) -> list[ScoreRecord]:
        async with gate:
            if breaker.tripped is not None:
                return [_record(m, None, rubric, model, mode, breaker.skipped()) for m in members]
            try:
                if mode == "absolute":
                    scores = [await absolute.judge_conversation(members[0].conversation())]
                else:
                    scores = (await grouped.judge_conversations([m.conversation() for m in members])).scores
            except JudgeError as exc:
                breaker.record(str(exc))
                return [_record(m, None, rubric, model, mode, str(exc)) for m in members]
            breaker.record(None)
            return [_record(m, s, rubric, model, mode, None) for m, s in zip(members, scores, strict=True)]

    units = [[i] for i in items] if mode == "absolute" else _groups(items)
    by_id = {r.id: r for rs in await asyncio.gather(*(unit(u) for u in units)) for r in rs}
    return [by_id[i.id] for i in items]


@dataclass(frozen=True)
class Coverage:
    """How many items a mean rests on: `scored` of `total`, and the mean over the scored ones."""

    scored: int
    total: int
    mean: float | None

    @classmethod
    def of(cls, records: Sequence[ScoreRecord]) -> Coverage:
        scores = [r.score for r in records if r.score is not None]
        return cls(len(scores), len(records), statistics.fmean(scores) if scores else None)

    @property
    def fraction(self) -> float:
        return self.scored / self.total if self.total else 0.0

    def __str__(self) -> str:
        """`0.660 over 38/40`, or `- over 0/40` when nothing was scored."""
        mean = "-" if self.mean is None else f"{self.mean:.3f}"
        return f"{mean} over {self.scored}/{self.total}"


def to_retry(items: Sequence[Item], previous: Sequence[ScoreRecord], mode: JudgeMode) -> list[Item]:
    """The items to ask again: those without a score in `previous`, with their whole group in group mode."""
    scored = {r.id for r in previous if r.score is not None}
    failed = [i for i in items if i.id not in scored]
    if mode == "absolute":
        return failed
    out: list[Item] = []
    for group in _groups(items):
        if any(m.id not in scored for m in group):
            out.extend(group)
    return out


def check_retry(
    previous: Sequence[ScoreRecord], rubric: Rubric, model: str, mode: JudgeMode, path: Path
) -> None:
    """Refuse to merge new scores into a file scored with another rubric, judge or mode."""
    for r in previous:
        mine = (rubric.content_hash, model, mode)
        theirs = (r.rubric_hash, r.judge_model, r.mode)
        if theirs != mine:
            raise ValueError(
                f"--retry-failed: {path} was scored with rubric #{r.rubric_hash}, judge {r.judge_model!r}, "
                f"mode {r.mode}; this run is rubric #{rubric.content_hash}, judge {model!r}, mode {mode}. "
                "Score it again without --retry-failed, or write to another --out"
            )


def merge(
    items: Sequence[Item], previous: Sequence[ScoreRecord], fresh: Sequence[ScoreRecord]
) -> list[ScoreRecord]:
    """One record per item, in item order: the fresh one where there is one, else the previous one."""
    by_id = {r.id: r for r in previous} | {r.id: r for r in fresh}
    return [by_id[i.id] for i in items if i.id in by_id]


def read_records(path: str | Path) -> list[ScoreRecord]:
    """Read a scores JSONL file written by `grooves judge score`."""
    return read_models(path, ScoreRecord, what="a score record")


def write_records(path: str | Path, records: Sequence[BaseModel]) -> None:
    """Write records as JSONL, replacing the file (a scores file is one batch, one rubric)."""
    write_models(path, records, append=False)
