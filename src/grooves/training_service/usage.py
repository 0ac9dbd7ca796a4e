"""Metering: tokens sampled and trained, per tenant (API key) and model.

Counted: `prompt_tokens` (each chat completion request's prompt, once however many samples `n`
asks for: they share one prefill), `sampled_tokens` (completion tokens of every sample), and
`trained_tokens` (every token of a step's training sequences, prompt and completion: what the
forward and backward passes run on), with `steps`. Each trainable model also writes one line per
step into its run folder (`usage.jsonl`: the step's trained tokens and the tokens sampled from
the model since the step before), and the totals are read back from those lines when the
service restarts. Sampling of the base model and of promoted adapters is counted from the start
of the service process.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

FIELDS = ("prompt_tokens", "sampled_tokens", "trained_tokens", "steps")


class Usage:
    """Running totals per (tenant, model)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], Counter[str]] = {}

    def add(self, tenant: str, model: str, **counts: int) -> None:
        unknown = set(counts) - set(FIELDS)
        if unknown:
            raise ValueError(f"unknown usage fields {sorted(unknown)}; known: {FIELDS}")
        with self._lock:
            self._counts.setdefault((tenant, model), Counter()).update(counts)

    def of(self, tenant: str) -> dict[str, Any]:
        """The tenant's totals and its models', as the `/v1/usage` route returns them."""
        with self._lock:
            rows = {m: dict(c) for (t, m), c in sorted(self._counts.items()) if t == tenant}
        models: list[dict[str, Any]] = [
            {"model": m, **{f: c.get(f, 0) for f in FIELDS}} for m, c in rows.items()
        ]
        total = {f: sum(m[f] for m in models) for f in FIELDS}
        return {"object": "usage", "tenant": tenant, "total": total, "data": models}
