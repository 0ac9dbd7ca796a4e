"""HTML pages for the calibration loop: one self-contained file each, no JavaScript.

Plain strings with every piece of model or user text passed through `html.escape`: outputs under
RL pressure contain markup on purpose (a policy that learns to emit `<script>` must not get to run
it in the reviewer's browser).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from grooves.judge.batch import Coverage, ScoreRecord
from grooves.judge.calibration import Agreement, PersonAgreement, Ties, Verdict

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; width: 100%; margin-bottom: 2em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; vertical-align: top; text-align: left; }
th { background: #f3f3f3; }
pre { white-space: pre-wrap; margin: 0; font-size: 0.9em; max-height: 16em; overflow: auto; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
.good, .match { color: #17692d; } .bad, .miss { color: #a01818; }
"""


def _num(x: float | None, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>\n"
        f"<body><h1>{escape(title)}</h1>\n{body}</body></html>\n"
    )


def _verdict_cell(v: Verdict | None) -> str:
    """The person's label, coloured as a label (good green, bad red), and the mark it came from."""
    if v is None:
        return "<td></td>"
    label = "good" if v.good else "bad"
    mark = ("agreed with" if v.agree else "disagreed with") + f" a {v.side} score"
    return f'<td><b class="{label}">{label}</b><br>{mark}<br>{escape(v.note)}</td>'


def _criteria(r: ScoreRecord) -> str:
    return "<br>".join(f"{escape(k)}: {_num(v, 2)}" for k, v in r.criteria.items())


def _records_table(records: Sequence[ScoreRecord], verdicts: dict[str, Verdict]) -> str:
    rows = [
        "<tr>"
        f'<td>{escape(r.id)}</td><td class="num">{_num(r.score)}</td><td>{_criteria(r)}</td>'
        f"<td>{escape(r.reason)}</td><td><pre>{escape(r.input)}</pre></td><td><pre>{escape(r.output)}</pre></td>"
        f"{_verdict_cell(verdicts.get(r.id))}</tr>"
        for r in records
    ]
    head = "<tr><th>id</th><th>score</th><th>criteria</th><th>reason</th><th>input</th><th>output</th><th>verdict</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>\n"


def inspect_page(
    tag: str,
    records: Sequence[ScoreRecord],
    top: Sequence[ScoreRecord],
    bottom: Sequence[ScoreRecord],
    verdicts: dict[str, Verdict],
    ties: Sequence[Ties | None] = (None, None),
    labelled: Sequence[ScoreRecord] = (),
) -> str:
    """The highest and lowest scored items with reasons, the person's labelled items, and the failures."""
    failed = [r for r in records if r.score is None]
    summary = (
        f"<p>rubric <code>{escape(tag)}</code>, judge <code>{escape(records[0].judge_model if records else '')}"
        f"</code>: mean score {escape(str(Coverage.of(records)))} scored, {len(failed)} failed.</p>\n"
    )
    body = summary + f"<h2>Highest {len(top)}</h2>\n" + _ties(ties[0]) + _records_table(top, verdicts)
    body += f"<h2>Lowest {len(bottom)}</h2>\n" + _ties(ties[1]) + _records_table(bottom, verdicts)
    if labelled:
        body += f"<h2>Labelled by you, not shown above ({len(labelled)})</h2>\n" + _records_table(
            labelled, verdicts
        )
    if failed:
        items = "".join(f"<li><code>{escape(r.id)}</code>: {escape(r.error or '')}</li>" for r in failed)
        body += f"<h2>Failed judgments ({len(failed)})</h2><ul>{items}</ul>\n"
    return _page(f"Judge calibration: {tag}", body)


def _ties(t: Ties | None) -> str:
    return "" if t is None else f"<p>{escape(str(t))}.</p>\n"


def _person_row(name: str, p: PersonAgreement | None) -> str:
    if p is None:
        return ""
    return (
        f'<tr><td>{escape(name)}</td><td class="num">{p.n}</td><td class="num">{_num(p.agree_fraction)}</td>'
        f'<td class="num">{_num(p.mean_score_good)}</td><td class="num">{_num(p.mean_score_bad)}</td></tr>'
    )


def _score_cell(score: float | None, v: Verdict | None, threshold: float) -> str:
    """A score, coloured by whether it agrees with the person's label at `threshold` (when labelled)."""
    if v is None or score is None:
        return f'<td class="num">{_num(score)}</td>'
    cls = "match" if (score >= threshold) == v.good else "miss"
    return f'<td class="num {cls}">{_num(score)}</td>'


def compare_page(
    tag_a: str,
    tag_b: str,
    agree: Agreement,
    a: Sequence[ScoreRecord],
    b: Sequence[ScoreRecord],
    person: tuple[PersonAgreement, PersonAgreement] | None,
    verdicts: dict[str, Verdict],
    threshold: float = 0.5,
    warnings: Sequence[str] = (),
) -> str:
    """Agreement between two score files (and with the person), items sorted by disagreement.

    A labelled item's A and B scores are green where they agree with the person's label (score >=
    `threshold` for "good", below it for "bad") and red where they do not.
    """
    body = (
        f"<p>A = <code>{escape(tag_a)}</code><br>B = <code>{escape(tag_b)}</code></p>\n"
        + "".join(f'<p class="bad">warning: {escape(w)}</p>\n' for w in warnings)
        + "<table><tr><th>items scored by both</th><th>Pearson</th><th>Spearman</th><th>mean |A - B|</th></tr>"
        f'<tr><td class="num">{agree.n}</td><td class="num">{_num(agree.pearson)}</td>'
        f'<td class="num">{_num(agree.spearman)}</td><td class="num">{_num(agree.mean_abs_diff)}</td></tr></table>\n'
    )
    if person is not None:
        body += (
            f"<h2>Agreement with the person's labels (judged good = score &gt;= {threshold:g})</h2><table><tr>"
            "<th>side</th><th>labelled items</th><th>agree fraction</th><th>mean score of 'good'</th>"
            f"<th>mean score of 'bad'</th></tr>{_person_row('A', person[0])}{_person_row('B', person[1])}</table>\n"
        )
    by_b = {r.id: r for r in b}
    pairs = [(r, by_b[r.id]) for r in a if r.id in by_b]
    pairs.sort(key=lambda p: -abs((p[0].score or 0.0) - (p[1].score or 0.0)))
    rows = "".join(
        f"<tr><td>{escape(ra.id)}</td>{_score_cell(ra.score, verdicts.get(ra.id), threshold)}"
        f"{_score_cell(rb.score, verdicts.get(ra.id), threshold)}"
        f"<td>{escape(ra.reason)}</td><td>{escape(rb.reason)}</td><td><pre>{escape(ra.output)}</pre></td>"
        f"{_verdict_cell(verdicts.get(ra.id))}</tr>"
        for ra, rb in pairs
    )
    body += (
        "<h2>Items, largest disagreement first</h2><table><tr><th>id</th><th>A</th><th>B</th><th>reason A</th>"
        f"<th>reason B</th><th>output</th><th>label</th></tr>{rows}</table>\n"
    )
    return _page("Judge comparison", body)
