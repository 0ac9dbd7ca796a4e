"""The calibration loop's logic: pick what a person reads, keep their verdicts, measure agreement.

A person cannot read a thousand judgments, but reading the highest and lowest k finds most judge
problems: a high score on an output that only looks right, a low score on a terse correct one.
For each shown item the person marks agree or disagree (with a note). The verdict is stored with
the side it was shown on, which turns it into a label: agreeing with a high score or disagreeing
with a low one means "good"; the other two mean "bad". Those labels let `compare` say how well any
later rubric version matches the person, not only how well it matches the previous version.

Judges often give many items the same score. The k shown at each end are then picked among the
tied items in a seeded order, not by id, and `Ties` says how many tied so the page can say so.
Items the person has already labelled, and the judge's failures, are always shown as well.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from grooves.jsonl import read_models, write_models
from grooves.judge.agreement import mean_abs_diff, pearson, spearman
from grooves.judge.batch import ScoreRecord

Side = Literal["top", "bottom"]


class Verdict(BaseModel):
    """A person's agree/disagree mark on one judged item; one line of a verdicts JSONL file."""

    model_config = ConfigDict(extra="forbid")

    id: str
    agree: bool
    note: str = ""
    side: Side
    """Whether the item was among the high ("top") or low ("bottom") scores when marked."""
    score: float
    rubric_version: str
    rubric_hash: str
    marked_at: float

    @property
    def good(self) -> bool:
        """The person's label: agree with a top score, or disagree with a bottom one."""
        return self.agree == (self.side == "top")


def valid(records: Sequence[ScoreRecord]) -> list[ScoreRecord]:
    return [r for r in records if r.score is not None]


def seeded_order(ids: Sequence[str], seed: int) -> dict[str, int]:
    """A reproducible random rank for each id: how ties are broken (the same seed, the same pick)."""
    order = sorted(ids)
    random.Random(f"inspect:{seed}").shuffle(order)
    return {i: k for k, i in enumerate(order)}


def extremes(
    records: Sequence[ScoreRecord], k: int, seed: int = 0
) -> tuple[list[ScoreRecord], list[ScoreRecord]]:
    """The k highest-scored records (best first) and the k lowest (worst first), never overlapping.

    Equal scores are ordered by `seeded_order`, so a cut through a tie takes a seeded sample of it.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    scored = valid(records)
    rank = seeded_order([r.id for r in scored], seed)
    ranked = sorted(scored, key=lambda r: (-(r.score or 0.0), rank[r.id]))
    top = ranked[:k]
    bottom = [r for r in reversed(ranked[k:])][:k]
    return top, bottom


@dataclass(frozen=True)
class Ties:
    """At the cut of a shown list: `tied` items share the last shown score, `shown` of them are shown."""

    score: float
    tied: int
    shown: int

    def __str__(self) -> str:
        return (
            f"{self.tied} items tie at {self.score:.3f}; {self.shown} of them shown, "
            "picked in a seeded order (--seed)"
        )


def ties(shown: Sequence[ScoreRecord], records: Sequence[ScoreRecord]) -> Ties | None:
    """The tie at the end of `shown`, when it holds more items than were shown; else None."""
    if not shown or shown[-1].score is None:
        return None
    cut = shown[-1].score
    tied = sum(1 for r in records if r.score == cut)
    on_show = sum(1 for r in shown if r.score == cut)
    return Ties(cut, tied, on_show) if tied > on_show else None


def labelled(
    records: Sequence[ScoreRecord], verdicts: dict[str, Verdict], skip: set[str]
) -> list[ScoreRecord]:
    """Records the person has a verdict for, other than those in `skip` (already on the page)."""
    return [r for r in records if r.id in verdicts and r.id not in skip]


def side_of(record: ScoreRecord, records: Sequence[ScoreRecord]) -> Side:
    """ "top" when the record's score is at or above the median score of the file, else "bottom"."""
    median = statistics.median(float(r.score) for r in records if r.score is not None)
    return "top" if (record.score or 0.0) >= median else "bottom"


def make_verdict(record: ScoreRecord, records: Sequence[ScoreRecord], agree: bool, note: str) -> Verdict:
    if record.score is None:
        raise ValueError(f"item {record.id!r} has no score ({record.error}); it cannot be marked")
    return Verdict(
        id=record.id,
        agree=agree,
        note=note,
        side=side_of(record, records),
        score=record.score,
        rubric_version=record.rubric_version,
        rubric_hash=record.rubric_hash,
        marked_at=time.time(),
    )


def _agree_value(raw: Any, where: str) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("agree", "yes", "y", "disagree", "no", "n"):
        return raw.strip().lower() in ("agree", "yes", "y")
    raise ValueError(f'{where}: "agree" must be true/false or "agree"/"disagree", got {raw!r}')


def import_verdicts(records: Sequence[ScoreRecord], path: str | Path) -> list[Verdict]:
    """Read `{id, agree, note}` lines (for scripting) and complete them against `records`."""
    by_id = {r.id: r for r in records}
    out = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not JSON: {exc}") from exc
            if not isinstance(raw, dict) or "id" not in raw or "agree" not in raw:
                raise ValueError(f'{where}: expected {{"id": ..., "agree": true|false, "note": "..."}}')
            record = by_id.get(str(raw["id"]))
            if record is None:
                raise ValueError(f"{where}: id {raw['id']!r} is not in the scores file")
            out.append(
                make_verdict(record, records, _agree_value(raw["agree"], where), str(raw.get("note", "")))
            )
    return out


def read_verdicts(path: str | Path) -> list[Verdict]:
    return read_models(path, Verdict, what="a verdict", missing_ok=True)


def _same(a: Verdict, b: Verdict) -> bool:
    return (a.id, a.agree, a.note, a.side, a.score, a.rubric_hash) == (
        b.id,
        b.agree,
        b.note,
        b.side,
        b.score,
        b.rubric_hash,
    )


def append_verdicts(path: str | Path, verdicts: Sequence[Verdict]) -> list[Verdict]:
    """Append the verdicts that change something; returns them.

    A verdict equal to the latest one kept for its id (same mark, note, side, score and rubric) is
    not written again, so importing one file twice, or marking an item the same way, adds nothing.
    """
    latest = latest_verdicts(read_verdicts(path))
    new: list[Verdict] = []
    for v in verdicts:
        if v.id in latest and _same(latest[v.id], v):
            continue
        latest[v.id] = v
        new.append(v)
    if new:
        write_models(path, new, append=True)
    return new


def latest_verdicts(verdicts: Sequence[Verdict]) -> dict[str, Verdict]:
    """The last verdict per id: a person may change their mind."""
    return {v.id: v for v in sorted(verdicts, key=lambda v: v.marked_at)}


class Agreement(BaseModel):
    """How two score files agree on the items both scored."""

    n: int
    pearson: float
    spearman: float
    mean_abs_diff: float


def agreement(a: Sequence[ScoreRecord], b: Sequence[ScoreRecord]) -> Agreement:
    """Pearson, Spearman and mean |a - b| over ids that both files scored successfully."""
    xs, ys = paired_scores(a, b)
    if not xs:
        return Agreement(n=0, pearson=math.nan, spearman=math.nan, mean_abs_diff=math.nan)
    return Agreement(
        n=len(xs), pearson=pearson(xs, ys), spearman=spearman(xs, ys), mean_abs_diff=mean_abs_diff(xs, ys)
    )


def paired_scores(a: Sequence[ScoreRecord], b: Sequence[ScoreRecord]) -> tuple[list[float], list[float]]:
    """Scores of the ids both files scored, in `a`'s order."""
    sb = {r.id: float(r.score) for r in b if r.score is not None}
    pairs = [(float(r.score), sb[r.id]) for r in a if r.score is not None and r.id in sb]
    return [x for x, _ in pairs], [y for _, y in pairs]


class PersonAgreement(BaseModel):
    """How one score file agrees with a person's labels (from their verdicts)."""

    n: int
    """Verdict items this file scored."""
    agree_fraction: float
    """Fraction where (score >= threshold) equals the person's good/bad label."""
    mean_score_good: float
    mean_score_bad: float


def person_agreement(
    records: Sequence[ScoreRecord], verdicts: Sequence[Verdict], threshold: float = 0.5
) -> PersonAgreement:
    """Compare scores with the person's labels; a good rubric scores their "good" items >= threshold."""
    scores = {r.id: float(r.score) for r in records if r.score is not None}
    marked = [(scores[v.id], v.good) for v in latest_verdicts(verdicts).values() if v.id in scores]
    good = [s for s, g in marked if g]
    bad = [s for s, g in marked if not g]
    hits = sum(1 for s, g in marked if (s >= threshold) == g)
    return PersonAgreement(
        n=len(marked),
        agree_fraction=hits / len(marked) if marked else math.nan,
        mean_score_good=statistics.fmean(good) if good else math.nan,
        mean_score_bad=statistics.fmean(bad) if bad else math.nan,
    )


def rubric_tag(records: Sequence[ScoreRecord]) -> str:
    """`name@version#hash` of a score file; raises if the file mixes rubrics."""
    tags = sorted({f"{r.rubric}@{r.rubric_version}#{r.rubric_hash}" for r in records})
    if len(tags) != 1:
        raise ValueError(f"a scores file must hold one rubric version, found {tags or 'none'}")
    return tags[0]


def judge_tag(records: Sequence[ScoreRecord]) -> str:
    """`judge NAME, MODE mode`: which judge model scored a file, and how (several are listed)."""
    models = sorted({r.judge_model for r in records})
    modes = sorted({r.mode for r in records})
    return f"judge {', '.join(models) or '-'}, {'/'.join(modes) or '-'} mode"
