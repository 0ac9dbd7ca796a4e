"""The run report's page: one self-contained file, in the style of the watch's inspection pages.

No scripts, no external styles or fonts, images inline as base64 PNGs: a page can be mailed,
attached to an issue or opened from a laptop with no server. Everything that came from a
model, a scenario, a metric name or the config is escaped with `html.escape`. The page frame,
the findings table and the sample tables are the watch's (`grooves.watch.pages`): the report
shows what the watch wrote, in the same form.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from grooves.report.plots import key_groups, panels, png_base64
from grooves.report.rundir import RunData
from grooves.watch.finding import Finding
from grooves.watch.pages import findings_table, page, pick_samples, samples_html, severity_badges


def figure_html(title: str, png_base64: str) -> str:
    """An inline PNG; the title becomes its alt text (the section heading shows it)."""
    alt = html.escape(title, quote=True)
    return f'<figure><img class="plot" alt="{alt}" src="data:image/png;base64,{png_base64}"></figure>'


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
    sparse = sparse_rewards_line(run.metrics)
    if sparse:
        summary += f'<p class="warning" id="sparse-rewards">{html.escape(sparse)}</p>'
    body = [summary, '<h2 id="findings">Watch findings</h2>', findings_table(findings)]
    body.append(
        '<h2 id="curves">Curves</h2><p class="muted">Vertical lines mark findings by number '
        "(red critical, orange warning, grey info).</p>"
    )
    for title, keys, rows, bands in key_groups(run.metrics, watch_rows):
        fig = panels(rows, keys, findings, bands=bands)
        if fig is not None:
            body.append(f"<h3>{html.escape(title)}</h3>" + figure_html(title, png_base64(fig)))
    body.append(_samples_section(run, findings, sample_steps, picks, seed))
    body.append(_inspect_links(run, links_from))
    config = html.escape(run.config_text) if run.config_text else "(no config.toml in the run directory)"
    body.append(f'<h2 id="config">Config</h2><pre class="config">{config}</pre>')
    return page(f"grooves report: {name}", "\n".join(body))


def sparse_rewards_line(rows: Sequence[dict]) -> str | None:
    """One sentence on equal-reward groups over a run (None when no step had any), from the
    per-step `groups_zero_variance_fraction`, `sparse_rewards` and `refill_draws` metrics.

    >>> sparse_rewards_line([{"groups_zero_variance_fraction": 1.0, "sparse_rewards": 1.0},
    ...                      {"groups_zero_variance_fraction": 0.0, "sparse_rewards": 0.0}])
    'Sparse rewards: 50% of groups had all-equal rewards (no gradient from them); 1 of 2 steps at or over rollout.zero_variance_warning.'
    """
    steps = [r for r in rows if "groups_zero_variance_fraction" in r]
    if not steps or not any(r["groups_zero_variance_fraction"] > 0 for r in steps):
        return None
    mean = sum(r["groups_zero_variance_fraction"] for r in steps) / len(steps)
    flagged = sum(r.get("sparse_rewards", 0.0) > 0 for r in steps)
    line = (
        f"Sparse rewards: {mean:.0%} of groups had all-equal rewards (no gradient from them); "
        f"{flagged} of {len(steps)} steps at or over rollout.zero_variance_warning."
    )
    draws = sum(r.get("refill_draws", 0.0) for r in steps)
    if draws:
        line += f" rollout.refill_zero_variance drew {draws:.0f} extra scenarios."
    return line


def _samples_section(
    run: RunData, findings: Sequence[Finding], limit: int, picks: tuple[int, int, int], seed: int
) -> str:
    steps = choose_sample_steps(list(run.sample_files), findings, limit)
    if not steps:
        return '<h2 id="samples">Samples</h2><p class="muted">The run kept no samples (samples/step_*.jsonl).</p>'
    parts = [
        '<h2 id="samples">Samples</h2>',
        f'<p class="muted">Best, worst and random outputs of {len(steps)} of {len(run.sample_files)} kept steps.</p>',
    ]
    for step in steps:
        chosen = pick_samples(
            run.samples(step),
            n_best=picks[0],
            n_worst=picks[1],
            n_random=picks[2],
            rng=np.random.default_rng([seed, step, 2]),
        )
        parts.append(
            f'<section class="sample-step" id="samples-step-{step}"><h3>Step {step}</h3>'
            f"{samples_html(chosen)}</section>"
        )
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
