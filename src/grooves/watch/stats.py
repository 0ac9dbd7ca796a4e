"""Robust statistics on short metric streams: the math the metric detectors stand on.

Pure functions on lists of floats. Robust (median/MAD) rather than mean/std because the thing
being detected is an outlier, and one outlier inside a window inflates a standard deviation
enough to hide the next one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MAD_TO_STD = 1.4826
"""MAD x 1.4826 estimates the standard deviation of normal data (1 / Phi^-1(3/4))."""


def robust_z(value: float, window: Sequence[float], min_scale: float = 1e-12) -> tuple[float, float, float]:
    """Modified z-score of `value` against `window`: (value - median) / (1.4826 * MAD).

    Iglewicz & Hoaglin (1993), "How to Detect and Handle Outliers". The scale is floored at
    `min_scale` so a constant window gives a large but finite score. Returns (z, median, scale).

    >>> z, center, scale = robust_z(10.0, [1.0, 2.0, 3.0, 4.0, 5.0])
    >>> center, round(scale, 4), round(z, 3)
    (3.0, 1.4826, 4.721)
    """
    arr = np.asarray(window, dtype=float)
    if arr.size == 0:
        raise ValueError("robust_z needs a non-empty window")
    center = float(np.median(arr))
    scale = max(MAD_TO_STD * float(np.median(np.abs(arr - center))), min_scale)
    return (value - center) / scale, center, scale


def linear_trend(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Ordinary least-squares slope of y on x and its t-statistic slope / SE(slope).

    SE(slope) = sqrt(SSR / (n - 2) / Sxx). A perfect fit (SSR = 0) has t = +-inf (0 when flat).

    >>> slope, t = linear_trend([0, 1, 2, 3], [0.0, 1.0, 2.0, 3.0])
    >>> slope, t
    (1.0, inf)
    >>> round(linear_trend([0, 1, 2, 3], [0.0, 2.0, 1.0, 3.0])[1], 3)
    1.886
    """
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = xa.size
    if n < 3 or n != ya.size:
        raise ValueError(f"linear_trend needs >= 3 paired points, got {n} x and {ya.size} y")
    xc = xa - xa.mean()
    sxx = float(xc @ xc)
    if sxx == 0:
        return 0.0, 0.0
    slope = float(xc @ (ya - ya.mean())) / sxx
    resid = ya - ya.mean() - slope * xc
    ssr = float(resid @ resid)
    if ssr <= 1e-24 * max(1.0, float(ya @ ya)):
        return slope, math.copysign(math.inf, slope) if slope != 0 else 0.0
    se = math.sqrt(ssr / (n - 2) / sxx)
    return slope, slope / se


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; nan when either side is constant.

    >>> pearson([1, 2, 3], [3, 2, 1])
    -1.0
    """
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    xc, yc = xa - xa.mean(), ya - ya.mean()
    denom = math.sqrt(float(xc @ xc) * float(yc @ yc))
    if denom == 0:
        return math.nan
    return max(-1.0, min(1.0, float(xc @ yc) / denom))


def finite(value: object) -> float | None:
    """The value as a float if it is a finite number, else None (metrics rows may hold nan or text)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    v = float(value)
    return v if math.isfinite(v) else None
