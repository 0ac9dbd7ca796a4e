"""The watch's inspection pages: the best, the worst and a random few outputs of a step, with scores.

The best and worst are where a cheat shows first (the hacked output scores highest); the random
ones show what is typical. A page is one self-contained HTML file (no scripts, no external
styles); all model and scenario text is escaped: outputs are untrusted and may contain markup.
The run report (`grooves.report`) builds its page from the same pieces.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from grooves.core.trajectory import TrajectoryGroup
from grooves.watch.finding import Finding
from grooves.watch.view import scenario_text


@dataclass(frozen=True)
class Sample:
    """One output picked for reading."""

    kind: str
    """"best", "worst" or "random"."""
    group: int
    input: str
    output: str
    reward: float
    rewards: dict[str, float] = field(default_factory=dict)
    tokens: int = 0


def pick_samples(
    groups: Sequence[TrajectoryGroup],
    *,
    n_best: int,
    n_worst: int,
    n_random: int,
    rng: np.random.Generator,
    input_keys: Sequence[str] | None = None,
) -> list[Sample]:
    """The n_best highest-reward, n_worst lowest and n_random others (no output twice).

    Failed rollouts have no output and are skipped. Ties in reward keep the groups' order.
    """
    flat = [(g, t) for g, group in enumerate(groups) for t in group.ok]
    order = sorted(range(len(flat)), key=lambda i: -flat[i][1].reward)
    best = order[:n_best]
    worst = [i for i in reversed(order) if i not in best][:n_worst]
    rest = [i for i in range(len(flat)) if i not in best and i not in worst]
    chosen = [int(i) for i in rng.permutation(rest)[:n_random]] if rest else []
    inputs = {g: scenario_text(groups[g], input_keys) for g in {flat[i][0] for i in best + worst + chosen}}
    picked = []
    for kind, indices in (("best", best), ("worst", worst), ("random", sorted(chosen))):
        for i in indices:
            g, t = flat[i]
            picked.append(
                Sample(
                    kind=kind,
                    group=g,
                    input=inputs[g],
                    output=t.completion,
                    reward=t.reward,
                    rewards=dict(t.rewards),
                    tokens=t.num_sampled_tokens,
                )
            )
    return picked


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return html.escape(text)
    return (
        html.escape(text[:limit]) + f'<span class="cut"> [\u2026 {len(text) - limit} more characters]</span>'
    )


def samples_html(samples: Sequence[Sample], max_chars: int = 1500) -> str:
    """A table of samples: kind, group, reward and each signal, input and output (escaped)."""
    if not samples:
        return '<p class="muted">No samples at this step.</p>'
    rows = []
    for s in samples:
        signals = " ".join(
            f'<span class="sig">{html.escape(k)}={v:.4g}</span>' for k, v in sorted(s.rewards.items())
        )
        rows.append(
            f'<tr class="sample {s.kind}"><td><span class="kind {s.kind}">{s.kind}</span></td>'
            f'<td>{s.group}</td><td class="num">{s.reward:.4g}</td><td>{signals}</td>'
            f'<td class="text input">{_cut(s.input, max_chars)}</td>'
            f'<td class="text output">{_cut(s.output, max_chars)}</td><td class="num">{s.tokens or "-"}</td></tr>'
        )
    head = (
        "<tr><th>pick</th><th>input</th><th>reward</th><th>signals</th><th>input text</th>"
        "<th>output</th><th>tokens</th></tr>"
    )
    return f'<table class="samples">{head}{"".join(rows)}</table>'


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1200px;
  padding:0 1rem;color:#1d1d1f;line-height:1.4}
h1{font-size:1.6rem;margin-bottom:.2rem} h2{margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
.muted{color:#666} .num{text-align:right;font-variant-numeric:tabular-nums}
table{border-collapse:collapse;width:100%;font-size:.9rem} th,td{border:1px solid #ddd;padding:.3rem .5rem;
  vertical-align:top;text-align:left} th{background:#f5f5f7}
.text{white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.82rem}
.input{max-width:420px;color:#444} .cut{color:#999}
.sev{font-weight:600;padding:.05rem .4rem;border-radius:.3rem;color:#fff;white-space:nowrap}
.sev.critical{background:#c62828} .sev.warning{background:#ef6c00} .sev.info{background:#78909c}
.kind{font-weight:600} .kind.best{color:#2e7d32} .kind.worst{color:#c62828} .kind.random{color:#555}
.sig{display:inline-block;background:#eef;border-radius:.25rem;padding:0 .3rem;margin:.1rem;font-size:.8rem}
img.plot{max-width:100%;border:1px solid #eee;margin:.5rem 0}
pre.config{background:#f7f7f9;padding:1rem;overflow:auto;font-size:.85rem}
details summary{cursor:pointer} .badges span{margin-right:.6rem}
"""


def page(title: str, body: str) -> str:
    """A complete HTML document around `body` (already escaped HTML)."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


def severity_badges(findings: Sequence[Finding]) -> str:
    """ "2 critical 1 warning" as coloured badges, or a plain "no findings"."""
    if not findings:
        return '<span class="muted">no findings</span>'
    counts = {s: sum(f.severity == s for f in findings) for s in ("critical", "warning", "info")}
    return "".join(f'<span class="sev {s}">{n} {s}</span> ' for s, n in counts.items() if n)


def findings_table(findings: Sequence[Finding]) -> str:
    """Numbered findings (the numbers match the marks on the curves), with their evidence."""
    if not findings:
        return '<p class="muted" id="no-findings">The watch raised no findings on this run.</p>'
    rows = []
    for number, f in enumerate(findings, start=1):
        evidence = html.escape(json.dumps(f.evidence, indent=1, default=str))
        rows.append(
            f'<tr class="finding" id="finding-{number}" data-step="{f.step}" data-detector="{html.escape(f.detector)}">'
            f'<td class="num">{number}</td><td class="num">{f.step}</td>'
            f'<td><span class="sev {f.severity}">{f.severity}</span></td><td>{html.escape(f.detector)}</td>'
            f"<td>{html.escape(f.message)}<details><summary>evidence</summary>"
            f'<pre class="text">{evidence}</pre></details></td></tr>'
        )
    head = "<tr><th>#</th><th>step</th><th>severity</th><th>detector</th><th>what the watch saw</th></tr>"
    return f'<table class="findings">{head}{"".join(rows)}</table>'


def inspection_page(
    step: int,
    samples: Sequence[Sample],
    findings: Sequence[Finding],
    max_chars: int,
    stats: dict[str, float] | None = None,
) -> str:
    """The watch's page for one step: findings since the previous page, the step's watch statistics, samples."""
    cells = "".join(
        f'<tr><td>{html.escape(k)}</td><td class="num">{v:.4g}</td></tr>'
        for k, v in sorted((stats or {}).items())
    )
    body = (
        f"<h1>Step {step}: sampled outputs</h1>"
        f'<p class="badges">{severity_badges(findings)}</p>'
        f"{findings_table(findings) if findings else ''}"
        f"{'<h2>Watch statistics</h2><table class=stats>' + cells + '</table>' if cells else ''}"
        "<h2>Best, worst and random outputs</h2>"
        '<p class="muted">Read the best ones first: a cheat scores highest.</p>'
        f"{samples_html(samples, max_chars)}"
    )
    return page(f"grooves inspection, step {step}", body)
