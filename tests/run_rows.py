"""Comparing two runs' metrics rows step by step (a resumed run against one that never stopped).

Every metric is compared to a relative tolerance, except the ones that measure rounding itself:
`mismatch_*` are the differences between the sampler's and the trainer's logprobs of the same
tokens (1e-7 to 1e-5, from kernels and batch shapes), which two processes, or two batchings of the
same step, round differently; they are held to an absolute bound instead. Wall times are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest

ROUNDING_BOUND = 1e-4
"""How far apart two runs' `mismatch_*` metrics may lie: an order above what the sampler and the
trainer differ by (tests/training/test_trainer.py holds `mismatch_k3_mean` below 1e-5)."""


def assert_same_rows(
    want: Iterable[Mapping[str, Any]], got: Iterable[Mapping[str, Any]], keys: Iterable[str] | None = None
) -> None:
    """Each row of `got` has `want`'s row's metrics (or only `keys`), to rel 1e-4 (abs 1e-6)."""
    for a, b in zip(want, got, strict=True):
        for key in keys if keys is not None else a:
            if key.startswith("seconds_"):
                continue
            if key.startswith("mismatch_"):
                assert abs(a[key] - b[key]) <= ROUNDING_BOUND, (a["step"], key, a[key], b[key])
            else:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)
