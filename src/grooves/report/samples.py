"""Samples a person reads: the best, the worst and a random few outputs of a step, with scores.

Used by the watch's inspection pages and by the run report. The best and worst are where a
cheat shows first (the hacked output scores highest); the random ones show what is typical.
All model and scenario text is escaped: outputs are untrusted and may contain markup.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from grooves.core.trajectory import TrajectoryGroup
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
    return html.escape(text[:limit]) + f'<span class="cut"> [\u2026 {len(text) - limit} more characters]</span>'


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
            f"<td>{s.group}</td><td class=\"num\">{s.reward:.4g}</td><td>{signals}</td>"
            f'<td class="text input">{_cut(s.input, max_chars)}</td>'
            f'<td class="text output">{_cut(s.output, max_chars)}</td><td class="num">{s.tokens or "-"}</td></tr>'
        )
    head = (
        "<tr><th>pick</th><th>input</th><th>reward</th><th>signals</th><th>input text</th>"
        "<th>output</th><th>tokens</th></tr>"
    )
    return f'<table class="samples">{head}{"".join(rows)}</table>'
