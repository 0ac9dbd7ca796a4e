"""HTML pages for the calibration loop: one self-contained file each, no JavaScript.

Plain strings with every piece of model or user text passed through `html.escape`: outputs under
RL pressure contain markup on purpose (a policy that learns to emit `<script>` must not get to run
it in the reviewer's browser).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from grooves.judge.batch import ScoreRecord
from grooves.judge.calibration import Agreement, PersonAgreement, Verdict

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; width: 100%; margin-bottom: 2em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; vertical-align: top; text-align: left; }
th { background: #f3f3f3; }
pre { white-space: pre-wrap; margin: 0; font-size: 0.9em; max-height: 16em; overflow: auto; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
.agree { color: #17692d; } .disagree { color: #a01818; }
"""


def _num(x: float | None, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head>\n"
        f"<body><h1>{escape(title)}</h1>\n{body}</body></html>\n"
    )


def _verdict_cell(v: Verdict | None) -> str:
    if v is None:
        return "<td></td>"
    cls = "agree" if v.agree else "disagree"
    word = "agree" if v.agree else "disagree"
    return f'<td class="{cls}">{word}<br>{escape(v.note)}</td>'


def _criteria(r: ScoreRecord) -> str:
    return "<br>".join(f"{escape(k)}: {_num(v, 2)}" for k, v in r.criteria.items())


def _records_table(records: Sequence[ScoreRecord], verdicts: dict[str, Verdict]) -> str:
    rows = [
        "<tr>"
        f"<td>{escape(r.id)}</td><td class=\"num\">{_num(r.score)}</td><td>{_criteria(r)}</td>"
        f"<td>{escape(r.reason)}</td><td><pre>{escape(r.input)}</pre></td><td><pre>{escape(r.output)}</pre></td>"
        f"{_verdict_cell(verdicts.get(r.id))}</tr>"
        for r in records
    ]
    head = "<tr><th>id</th><th>score</th><th>criteria</th><th>reason</th><th>input</th><th>output</th><th>verdict</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>\n"


def inspect_page(
    tag: str, records: Sequence[ScoreRecord], top: Sequence[ScoreRecord], bottom: Sequence[ScoreRecord],
    verdicts: dict[str, Verdict],
) -> str:
    """The highest and lowest scored items with reasons and any verdicts."""
    scored = [r.score for r in records if r.score is not None]
    failed = [r for r in records if r.score is None]
    mean = sum(scored) / len(scored) if scored else None
    summary = (
        f"<p>rubric <code>{escape(tag)}</code>, judge <code>{escape(records[0].judge_model if records else '')}"
        f"</code>: {len(scored)} scored, {len(failed)} failed, mean score {_num(mean)}.</p>\n"
    )
    body = summary + f"<h2>Highest {len(top)}</h2>\n" + _records_table(top, verdicts)
    body += f"<h2>Lowest {len(bottom)}</h2>\n" + _records_table(bottom, verdicts)
    if failed:
        items = "".join(f"<li><code>{escape(r.id)}</code>: {escape(r.error or '')}</li>" for r in failed)
        body += f"<h2>Failed judgments</h2><ul>{items}</ul>\n"
    return _page(f"Judge calibration: {tag}", body)


def _person_row(name: str, p: PersonAgreement | None) -> str:
    if p is None:
        return ""
    return (f"<tr><td>{escape(name)}</td><td class=\"num\">{p.n}</td><td class=\"num\">{_num(p.agree_fraction)}</td>"
            f"<td class=\"num\">{_num(p.mean_score_good)}</td><td class=\"num\">{_num(p.mean_score_bad)}</td></tr>")


def compare_page(
    tag_a: str, tag_b: str, agree: Agreement, a: Sequence[ScoreRecord], b: Sequence[ScoreRecord],
    person: tuple[PersonAgreement, PersonAgreement] | None, verdicts: dict[str, Verdict],
) -> str:
    """Agreement between two rubric versions (and with the person), items sorted by disagreement."""
    body = (
        f"<p>A = <code>{escape(tag_a)}</code><br>B = <code>{escape(tag_b)}</code></p>\n"
        "<table><tr><th>items scored by both</th><th>Pearson</th><th>Spearman</th><th>mean |A - B|</th></tr>"
        f"<tr><td class=\"num\">{agree.n}</td><td class=\"num\">{_num(agree.pearson)}</td>"
        f"<td class=\"num\">{_num(agree.spearman)}</td><td class=\"num\">{_num(agree.mean_abs_diff)}</td></tr></table>\n"
    )
    if person is not None:
        body += (
            "<h2>Agreement with the person's verdicts</h2><table><tr><th>rubric</th><th>verdicts</th>"
            "<th>agree fraction</th><th>mean score of 'good'</th><th>mean score of 'bad'</th></tr>"
            f"{_person_row('A', person[0])}{_person_row('B', person[1])}</table>\n"
        )
    by_b = {r.id: r for r in b}
    pairs = [(r, by_b[r.id]) for r in a if r.id in by_b]
    pairs.sort(key=lambda p: -abs((p[0].score or 0.0) - (p[1].score or 0.0)))
    rows = "".join(
        f"<tr><td>{escape(ra.id)}</td><td class=\"num\">{_num(ra.score)}</td><td class=\"num\">{_num(rb.score)}</td>"
        f"<td>{escape(ra.reason)}</td><td>{escape(rb.reason)}</td><td><pre>{escape(ra.output)}</pre></td>"
        f"{_verdict_cell(verdicts.get(ra.id))}</tr>"
        for ra, rb in pairs
    )
    body += ("<h2>Items, largest disagreement first</h2><table><tr><th>id</th><th>A</th><th>B</th><th>reason A</th>"
             f"<th>reason B</th><th>output</th><th>verdict</th></tr>{rows}</table>\n")
    return _page("Judge comparison", body)
