"""Curves of a run as PNGs, with the watch's findings marked on the timeline.

Matplotlib's object API (`Figure` + the Agg canvas), not pyplot: no global backend or figure
state, so a trainer can draw from any thread and nothing pops up on a desktop. Each finding
is a vertical line in its severity's colour on every panel, labelled with its number in the
findings table, so a jump in a curve and the finding that named it sit side by side.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from grooves.watch.finding import Finding

SEVERITY_COLORS = {"critical": "#c62828", "warning": "#ef6c00", "info": "#90a4ae"}
MAX_SIGNAL_PANELS = 12
"""Reward signals drawn, the first by name: each panel takes a fixed time to draw, and a run (or a
trainable model of the service) with hundreds of signal names took minutes to report."""
TRAINING_FIRST = ["loss", "kl", "clip_fraction", "grad_norm", "entropy", "lr", "zero_variance_fraction"]


def series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one key, skipping rows without a finite number for it."""
    steps, values = [], []
    for i, row in enumerate(rows):
        value = row.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(float(row.get("step", i)))
            values.append(float(value))
    return steps, values


def png_base64(fig: Figure) -> str:
    """The figure as a base64 PNG string (for a `data:` URL)."""
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def panels(
    rows: Sequence[Mapping[str, Any]],
    keys: Sequence[str],
    findings: Sequence[Finding] = (),
    *,
    bands: Mapping[str, str] | None = None,
    columns: int = 2,
) -> Figure | None:
    """One small panel per key, shared step axis; `bands[key]` names a std key drawn as mean +- std.

    Returns None when no key has a single point to draw.
    """
    keys = [k for k in keys if series(rows, k)[0]]
    if not keys:
        return None
    columns = min(columns, len(keys))
    height = math.ceil(len(keys) / columns)
    fig = Figure(figsize=(5.6 * columns, 2.7 * height), layout="constrained")
    axes = fig.subplots(height, columns, squeeze=False, sharex=True)
    for ax, key in zip(axes.flat, keys, strict=False):
        steps, values = series(rows, key)
        ax.plot(steps, values, color="#1f77b4", lw=1.4, marker="o" if len(steps) < 30 else None, ms=3)
        std_key = (bands or {}).get(key)
        if std_key:
            _band(ax, rows, key, std_key)
        _mark(ax, findings)
        ax.set_title(key, fontsize=10, loc="left")
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(keys) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("step", fontsize=9)
    return fig


def _band(ax, rows: Sequence[Mapping[str, Any]], key: str, std_key: str) -> None:
    by_step = dict(zip(*series(rows, std_key), strict=True))
    steps, means = series(rows, key)
    pairs = [(s, m, by_step[s]) for s, m in zip(steps, means, strict=True) if s in by_step]
    if pairs:
        s, m, d = zip(*pairs, strict=True)
        ax.fill_between(
            s,
            [a - b for a, b in zip(m, d, strict=True)],
            [a + b for a, b in zip(m, d, strict=True)],
            color="#1f77b4",
            alpha=0.15,
            lw=0,
            label="+-1 std",
        )


def _mark(ax, findings: Sequence[Finding]) -> None:
    for number, f in enumerate(findings, start=1):
        color = SEVERITY_COLORS.get(f.severity, "#555")
        ax.axvline(f.step, color=color, lw=1.2, alpha=0.8, ls="--" if f.severity == "info" else "-")
        ax.annotate(  # staggered, so findings a step apart keep readable numbers
            str(number),
            xy=(f.step, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -10 - 9 * (number % 3)),
            textcoords="offset points",
            color=color,
            fontsize=8,
            fontweight="bold",
        )


def key_groups(
    metric_rows: Sequence[Mapping[str, Any]], watch_rows: Sequence[Mapping[str, Any]]
) -> list[tuple[str, list[str], Sequence[Mapping[str, Any]], dict[str, str]]]:
    """The report's figures: (title, keys, rows they come from, bands) for each non-empty section.

    Rewards first (the trained reward and each signal, with std bands; the first
    `MAX_SIGNAL_PANELS` signals by name, the title saying how many were left out), then independent
    checks, the watch's own statistics, lengths, and every other numeric key as training diagnostics.
    """
    keys = sorted({k for row in metric_rows for k, v in row.items() if _number(v)} - {"step"})
    signals = [k for k in keys if k.startswith("reward/") and k.endswith("_mean")]
    rewards = [k for k in ("reward_mean",) if k in keys] + signals[:MAX_SIGNAL_PANELS]
    title = "Rewards (trained reward and each signal)"
    if len(signals) > MAX_SIGNAL_PANELS:
        title = (
            f"Rewards (trained reward and {MAX_SIGNAL_PANELS} of {len(signals)} signals, the first by name; "
            f"{len(signals) - MAX_SIGNAL_PANELS} left out, all in metrics.jsonl)"
        )
    bands = {k: k[: -len("_mean")] + "_std" for k in rewards if k[: -len("_mean")] + "_std" in keys}
    checks = [k for k in keys if k.startswith(("val/", "check/"))]
    lengths = [k for k in keys if ("tokens" in k or "length" in k) and not k.startswith("reward")]
    watch_keys = sorted({k for row in watch_rows for k, v in row.items() if _number(v)} - {"step"})
    metric_watch = [k for k in keys if k.startswith("watch/")]
    taken = (
        set(rewards) | set(bands.values()) | set(checks) | set(lengths) | set(metric_watch) | {"reward_std"}
    )
    rest = [k for k in keys if k not in taken and not k.startswith("reward/")]
    rest = [k for k in TRAINING_FIRST if k in rest] + [k for k in rest if k not in TRAINING_FIRST]
    sections = [
        (title, rewards, metric_rows, bands),
        ("Independent checks", checks, metric_rows, {}),
        ("Watch statistics", watch_keys, watch_rows, {}),
        ("Watch statistics (from metrics)", [] if watch_keys else metric_watch, metric_rows, {}),
        ("Completion length", lengths, metric_rows, {}),
        ("Training diagnostics", rest[:16], metric_rows, {}),
    ]
    return [s for s in sections if s[1]]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
