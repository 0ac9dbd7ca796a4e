"""Agreement statistics between two lists of scores: Pearson, Spearman, mean absolute difference.

Used to compare two rubric versions on the same outputs, and a reward model's predictions with the
scores it was trained to imitate. Pearson measures linear agreement of the values; Spearman, the
Pearson correlation of the ranks, measures whether the two agree on the *order*, which is all a
group-relative advantage uses. Ties get their average rank (the standard "fractional ranking").
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _check(a: Sequence[float], b: Sequence[float]) -> None:
    if len(a) != len(b):
        raise ValueError(f"need two equally long sequences, got {len(a)} and {len(b)}")


def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    """r = sum (a_i - mean a)(b_i - mean b) / sqrt(sum (a_i - mean a)^2 * sum (b_i - mean b)^2).

    NaN when either side is constant or has fewer than 2 values (correlation is undefined there).

    >>> round(pearson([1, 2, 3], [2, 4, 7]), 4)
    0.9934
    """
    _check(a, b)
    n = len(a)
    if n < 2:
        return math.nan
    ma, mb = sum(a) / n, sum(b) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b, strict=True))
    va = sum((x - ma) ** 2 for x in a)
    vb = sum((y - mb) ** 2 for y in b)
    if va == 0 or vb == 0:
        return math.nan
    return cov / math.sqrt(va * vb)


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of the ranks they span.

    >>> ranks([0.5, 0.1, 0.5, 0.9])
    [2.5, 1.0, 2.5, 4.0]
    """
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho: the Pearson correlation of the (tie-averaged) ranks.

    >>> spearman([1, 2, 3, 4], [10, 20, 30, 100])
    1.0
    """
    _check(a, b)
    return pearson(ranks(a), ranks(b))


def mean_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    """(1/n) sum_i |a_i - b_i|; NaN for empty input.

    >>> mean_abs_diff([0.5, 1.0], [0.25, 1.0])
    0.125
    """
    _check(a, b)
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a) if a else math.nan
