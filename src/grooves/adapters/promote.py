"""Continual promotion: put a new checkpoint into production, and take it back out.

`Promoter.promote(name, path)` makes a served name answer with a new adapter through
`ModelRoutes.replace` (load first, switch atomically, unload the old one once its requests
finish) and remembers what the name served before; `rollback(name)` switches back to that, one
step at a time. Each switch gets a new route version, so responses say which deployment answered.
Promotions of the table are serialized: two at once could otherwise record their history in a
different order than they switched.

`watch_run` is the "continual" part: it polls a run folder while it trains and promotes each new
checkpoint that passes the selection (`best` by a validation metric, or simply `latest`), through
any `promote(path)` callable (in process, or over HTTP with `http_promoter`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from grooves.adapters.registry import DEFAULT_METRIC, AdapterNotFound, AdapterRegistry
from grooves.serve.routing import ModelRoutes, Route


class NothingToRollBack(LookupError):
    """`rollback` on a name that was never promoted (or already rolled all the way back)."""


class Promoter:
    """Promotion with history over an `ModelRoutes` (the Python API behind the HTTP endpoints)."""

    def __init__(self, table: ModelRoutes):
        self.table = table
        self._lock = threading.Lock()
        self._history: dict[str, list[str | None]] = {}

    def promote(self, name: str, path: str | Path) -> Route:
        """Serve `name` with the adapter at `path` from now on; returns the new route."""
        with self._lock:
            old, new = self.table.replace(name, path)
            self._history.setdefault(name, []).append(old.path)
            return new

    def rollback(self, name: str) -> Route:
        """Serve `name` with what it served before its last promotion; returns the new route."""
        with self._lock:
            previous = self._history.get(name)
            if not previous:
                raise NothingToRollBack(f"model {name!r} has no earlier promotion to roll back to")
            _, new = self.table.replace(name, previous[-1])
            previous.pop()
            return new

    def history(self, name: str) -> list[str | None]:
        """Paths `name` served before, oldest first (None: the policy's own weights)."""
        with self._lock:
            return list(self._history.get(name, []))


def pick_checkpoint(
    run_dir: str | Path,
    select: Literal["best", "latest"],
    metric: str = DEFAULT_METRIC,
    mode: Literal["max", "min"] = "max",
) -> Path | None:
    """The adapter `watch_run` would promote now, or None if the run has none yet."""
    try:
        registry = AdapterRegistry(run_dir)
        entry = registry.best(metric, mode) if select == "best" else registry.latest()
    except AdapterNotFound:
        return None
    return entry.adapter


def watch_run(
    run_dir: str | Path,
    promote: Callable[[Path], object],
    *,
    select: Literal["best", "latest"] = "best",
    metric: str = DEFAULT_METRIC,
    mode: Literal["max", "min"] = "max",
    interval_s: float = 30.0,
    stop: threading.Event | None = None,
    max_promotions: int | None = None,
) -> list[Path]:
    """Promote each new checkpoint of a run as it appears; returns the paths promoted.

    Runs until `stop` is set or `max_promotions` have been made. A checkpoint is promoted once;
    pruning (`checkpoint.keep`) never un-promotes anything.
    """
    stop = stop or threading.Event()
    promoted: list[Path] = []
    last: Path | None = None
    while not stop.is_set():
        chosen = pick_checkpoint(run_dir, select, metric, mode)
        if chosen is not None and chosen != last:
            promote(chosen)
            promoted.append(chosen)
            last = chosen
            if max_promotions is not None and len(promoted) >= max_promotions:
                break
        stop.wait(interval_s)
    return promoted


def http_promoter(base_url: str, name: str, *, timeout: float = 120.0) -> Callable[[Path], dict]:
    """A `promote(path)` that asks a running `grooves serve`; `base_url` ends in /v1, as for openai."""
    import httpx

    def promote(path: Path) -> dict:
        resp = httpx.post(
            f"{base_url.rstrip('/')}/adapters/{name}/promote",
            json={"path": str(Path(path).resolve())},
            timeout=timeout,
        )
        if resp.status_code >= 400:
            raise RuntimeError(
                f"promote {name} -> {path}: HTTP {resp.status_code}: {resp.json().get('error', {}).get('message')}"
            )
        return resp.json()

    return promote
