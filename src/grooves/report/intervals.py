"""95% intervals for evaluation figures: Wilson's for a success rate, a bootstrap for a mean reward.

Pure functions on lists of numbers. `grooves eval` reports both; each figure is a mean over the
rollouts that finished (failed rollouts are counted apart, as in training).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Z95 = 1.959963984540054
"""The standard normal's 97.5% quantile: a two-sided 95% interval."""


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a proportion (Wilson 1927; recommended over the normal
    approximation by Brown, Cai & DasGupta 2001, Statistical Science 16(2)).

    With p = successes / n:

        center = (p + z^2 / 2n) / (1 + z^2 / n)
        half   = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / 4n^2)

    It stays inside [0, 1] and is not empty at p = 0 or 1, where the normal approximation gives a
    zero-width interval. It treats the n outcomes as independent: several samples of one scenario
    are not, so with `samples` > 1 the interval is narrower than the scenarios alone support.

    >>> [round(x, 4) for x in wilson_interval(8, 10)]
    [0.4902, 0.9433]
    >>> [round(x, 4) for x in wilson_interval(0, 20)]
    [0.0, 0.1611]
    """
    if n <= 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n))
    return (max(0.0, center - half), min(1.0, center + half))


def bootstrap_interval(
    clusters: Sequence[Sequence[float]], *, resamples: int = 10_000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of all values, resampling whole clusters
    (Efron & Tibshirani 1993, ch. 13; clusters resampled as in Davison & Hinkley 1997, sec. 3.8).

    A cluster is one scenario's rewards (its `samples` rollouts): they are drawn together, so
    samples of one scenario, which tend to agree, do not count as independent evidence. Each of
    `resamples` draws picks len(clusters) clusters with replacement; the statistic is the mean
    over every value in them (sum of values / number of values); the interval is the draws'
    (1 - level) / 2 and (1 + level) / 2 quantiles. Seeded: the same input gives the same interval.
    It makes no normality assumption, which matters for rewards bounded in [0, 1] near an end.

    >>> bootstrap_interval([[1.0], [1.0], [1.0]])
    (1.0, 1.0)
    >>> lo, hi = bootstrap_interval([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    >>> 0.0 <= lo < 0.5 < hi <= 1.0
    True
    """
    clusters = [list(c) for c in clusters if len(c)]
    if not clusters:
        return (math.nan, math.nan)
    sums = np.array([sum(c) for c in clusters], dtype=np.float64)  # [C]
    counts = np.array([len(c) for c in clusters], dtype=np.float64)  # [C]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(clusters), size=(resamples, len(clusters)))  # [R, C]
    means = sums[picks].sum(axis=1) / counts[picks].sum(axis=1)  # [R]
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return (float(low), float(high))


def paired_difference(
    a: Sequence[float], b: Sequence[float], *, resamples: int = 10_000, seed: int = 0
) -> dict[str, float | int]:
    """A - B over paired scenarios: `a[i]` and `b[i]` are one scenario's figure (its success rate,
    its mean reward) under two models on the same requests. The mean difference, its percentile
    bootstrap 95% interval resampling scenarios (pairing takes each scenario's own difficulty out
    of the comparison), and on how many scenarios A is better, worse or the same.

    >>> d = paired_difference([1.0, 1.0, 0.5, 0.0], [0.0, 1.0, 0.5, 1.0])
    >>> d["difference"], d["better"], d["worse"], d["same"]
    (0.0, 1, 1, 2)
    """
    if len(a) != len(b):
        raise ValueError(f"paired figures need the same scenarios: {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    low, high = bootstrap_interval([[d] for d in diffs], resamples=resamples, seed=seed)
    return {
        "difference": sum(diffs) / len(diffs) if diffs else math.nan,
        "low": low,
        "high": high,
        "scenarios": len(diffs),
        "better": sum(d > 0 for d in diffs),
        "worse": sum(d < 0 for d in diffs),
        "same": sum(d == 0 for d in diffs),
    }
