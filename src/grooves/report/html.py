"""HTML pages: the run report and the watch's inspection pages, each one self-contained file.

No scripts, no external styles or fonts, images inline as base64 PNGs: a page can be mailed,
attached to an issue or opened from a laptop with no server. Everything that came from a
model, a scenario, a metric name or the config is escaped with `html.escape`.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from grooves.report.plots import key_groups, panels, png_base64
from grooves.report.rundir import RunData
from grooves.report.samples import Sample, pick_samples, samples_html
from grooves.watch.finding import Finding

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
    """"2 critical 1 warning" as coloured badges, or a plain "no findings"."""
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


def figure_html(title: str, png_base64: str) -> str:
    """An inline PNG; the title becomes its alt text (the section heading shows it)."""
    alt = html.escape(title, quote=True)
    return f'<figure><img class="plot" alt="{alt}" src="data:image/png;base64,{png_base64}"></figure>'


def inspection_page(
    step: int,
    samples: Sequence[Sample],
    findings: Sequence[Finding],
    max_chars: int,
    stats: dict[str, float] | None = None,
) -> str:
    """The watch's page for one step: findings since the previous page, the step's watch statistics, samples."""
    cells = "".join(
        f'<tr><td>{html.escape(k)}</td><td class="num">{v:.4g}</td></tr>' for k, v in sorted((stats or {}).items())
    )
    body = (
        f"<h1>Step {step}: sampled outputs</h1>"
        f'<p class="badges">{severity_badges(findings)}</p>'
        f"{findings_table(findings) if findings else ''}"
        f'{"<h2>Watch statistics</h2><table class=stats>" + cells + "</table>" if cells else ""}'
        "<h2>Best, worst and random outputs</h2>"
        '<p class="muted">Read the best ones first: a cheat scores highest.</p>'
        f"{samples_html(samples, max_chars)}"
    )
    return page(f"grooves inspection, step {step}", body)


def choose_sample_steps(available: Sequence[int], findings: Sequence[Finding], limit: int) -> list[int]:
    """Which sample steps to show: the first, the last, and the first kept at or after each finding."""
    if not available or limit <= 0:
        return []
    steps = sorted(available)
    wanted = [steps[0], steps[-1]]
    for f in findings:
        if f.severity != "info":
            later = [s for s in steps if s >= f.step]
            wanted.append(later[0] if later else steps[-1])
    chosen: list[int] = []
    for s in wanted:
        if s not in chosen and len(chosen) < limit:
            chosen.append(s)
    return sorted(chosen)


def report_page(
    run: RunData,
    findings: Sequence[Finding],
    watch_rows: Sequence[dict],
    *,
    sample_steps: int = 6,
    picks: tuple[int, int, int] = (3, 3, 4),
    seed: int = 0,
    links_from: Path | None = None,
) -> str:
    """The whole run report: summary, findings, curves with findings marked, samples, config.

    `picks` is (best, worst, random) per shown sample step; `links_from` is the folder the page
    will be written to, for relative links to the inspection pages.
    """
    name = run.path.resolve().name
    last = run.metrics[-1] if run.metrics else {}
    summary = (
        f"<h1>grooves run: {html.escape(name)}</h1>"
        f'<p class="muted">{len(run.metrics)} steps logged, last step {html.escape(str(last.get("step", "-")))}; '
        f"final reward_mean {_fmt(last.get('reward_mean'))}</p>"
        f'<p class="badges" id="summary">{severity_badges(findings)}</p>'
    )
    body = [summary, "<h2 id=\"findings\">Watch findings</h2>", findings_table(findings)]
    body.append('<h2 id="curves">Curves</h2><p class="muted">Vertical lines mark findings by number '
                "(red critical, orange warning, grey info).</p>")
    for title, keys, rows, bands in key_groups(run.metrics, watch_rows):
        fig = panels(rows, keys, findings, bands=bands)
        if fig is not None:
            body.append(f"<h3>{html.escape(title)}</h3>" + figure_html(title, png_base64(fig)))
    body.append(_samples_section(run, findings, sample_steps, picks, seed))
    body.append(_inspect_links(run, links_from))
    config = html.escape(run.config_text) if run.config_text else "(no config.toml in the run directory)"
    body.append(f'<h2 id="config">Config</h2><pre class="config">{config}</pre>')
    return page(f"grooves report: {name}", "\n".join(body))


def _samples_section(run: RunData, findings: Sequence[Finding], limit: int, picks: tuple[int, int, int], seed: int) -> str:
    steps = choose_sample_steps(list(run.sample_files), findings, limit)
    if not steps:
        return '<h2 id="samples">Samples</h2><p class="muted">The run kept no samples (samples/step_*.jsonl).</p>'
    parts = ['<h2 id="samples">Samples</h2>',
             f'<p class="muted">Best, worst and random outputs of {len(steps)} of {len(run.sample_files)} kept steps.</p>']
    for step in steps:
        chosen = pick_samples(run.samples(step), n_best=picks[0], n_worst=picks[1], n_random=picks[2],
                              rng=np.random.default_rng([seed, step, 2]))
        parts.append(f'<section class="sample-step" id="samples-step-{step}"><h3>Step {step}</h3>'
                     f"{samples_html(chosen)}</section>")
    return "".join(parts)


def _inspect_links(run: RunData, links_from: Path | None) -> str:
    if not run.inspect_pages:
        return ""
    base = links_from or run.path
    links = " ".join(
        f'<a href="{html.escape(Path(os.path.relpath(p, base)).as_posix(), quote=True)}">step {s}</a>'
        for s, p in run.inspect_pages.items()
    )
    return f'<h2 id="inspect">Inspection pages</h2><p>{links}</p>'


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) and not isinstance(value, bool) else "-"
