"""Which weights answer each served model name, changed at run time without dropping a request.

One base model in memory serves many names: the policy's own name (its own weights: the base, or
the adapter it was started with) and any number of extra LoRA adapters loaded beside it. A name
maps to a `Route`, an immutable record of (peft adapter id, version, path). Three rules make
swaps atomic:

1. A request takes a *lease* on its route when it arrives and keeps it until its response is
   built; the route (id and version) it reports is the one it was sampled with.
2. Replacing a name's adapter loads the new one under a fresh id first, then switches the
   name -> route mapping in one step under the table's lock. Requests that arrive after the switch
   see only the new route; requests holding a lease on the old one finish on it.
3. The old adapter is unloaded only when its last lease is returned ("drained"), on a worker
   thread, so neither a request nor the event loop waits for it.

Adapters are never renamed in place: each load gets a new id (`adapter_1`, `adapter_2`, ...), so
"which adapter produced this response" has one answer. Promotion history and rollback are built
on `replace` in `grooves.adapters.promote`.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from grooves.policy.base import Policy


class UnknownModel(KeyError):
    """A request or admin call named a model that is not served."""

    def __init__(self, name: str, available: list[str]):
        super().__init__(name)
        self.name, self.available = name, available

    def __str__(self) -> str:
        return f"model {self.name!r} is not served here; available: {self.available}"


class AdapterConflict(ValueError):
    """An admin call that would break a route (a name taken, the policy's own name removed...)."""


@dataclass(frozen=True)
class Route:
    name: str
    """The served model name clients send."""
    adapter_id: str | None
    """peft adapter id, or None for the policy's own weights."""
    version: int | None
    """Bumped on each replacement of this name; None: the policy's live training version. For a
    snapshot of the training adapter (`ModelRoutes.pin`): the training version it holds."""
    path: str | None
    """Where the adapter was loaded from (None for the policy's own weights)."""

    @property
    def label(self) -> str:
        return self.adapter_id or "own"


class ModelRoutes:
    """Served name -> `Route`, with leases so replacements never cut a request short."""

    def __init__(self, policy: Policy, *, own_path: str | None = None):
        self.policy = policy
        self._lock = threading.Lock()
        self._routes: dict[str, Route] = {policy.served_name: Route(policy.served_name, None, None, own_path)}
        self._leases: Counter[str] = Counter()
        self._retired: set[str] = set()
        self._loading: set[str] = set()
        self._ids = itertools.count(1)
        self._unloader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grooves-unload")
        self._pending: list[Future] = []

    # ---- reading ---------------------------------------------------------------------------
    def routes(self) -> list[Route]:
        with self._lock:
            return list(self._routes.values())

    def names(self) -> list[str]:
        with self._lock:
            return list(self._routes)

    def get(self, name: str) -> Route:
        with self._lock:
            return self._get(name)

    def _get(self, name: str) -> Route:
        route = self._routes.get(name)
        if route is None:
            raise UnknownModel(name, list(self._routes))
        return route

    def in_flight(self, adapter_id: str | None = None) -> int:
        """Requests holding a lease on `adapter_id` (all loaded adapters when None)."""
        with self._lock:
            return sum(self._leases.values()) if adapter_id is None else self._leases[adapter_id]

    def version_of(self, route: Route) -> int:
        return route.version if route.version is not None else self.policy.adapters.version

    # ---- requests --------------------------------------------------------------------------
    @contextmanager
    def lease(self, name: str) -> Iterator[Route]:
        """The route a request runs on; its adapter stays loaded until the block exits."""
        with self._lock:
            route = self._get(name)
            if route.adapter_id is not None:
                self._leases[route.adapter_id] += 1
        try:
            yield route
        finally:
            if route.adapter_id is not None:
                with self._lock:
                    self._leases[route.adapter_id] -= 1
                    self._unload_if_drained(route.adapter_id)

    # ---- changing routes -------------------------------------------------------------------
    def add(self, name: str, path: str | Path) -> Route:
        """Serve a new name with the adapter at `path`."""
        return self._add(name, path, 1)

    def pin(self, name: str, path: str | Path, version: int) -> Route:
        """Serve `name` with a saved snapshot of the policy's training adapter as it was at training
        `version`; responses report that version. The trainer samples steps ahead of its weights
        with it (`rollout.max_staleness`) and removes the name once the step has its rollouts."""
        return self._add(name, path, version)

    def _add(self, name: str, path: str | Path, version: int) -> Route:
        with self._lock:
            if name in self._routes or name in self._loading:
                raise AdapterConflict(f"model {name!r} is already served; promote it to change its adapter")
            self._loading.add(name)
        try:
            adapter_id = self._load(path)
            with self._lock:
                route = self._routes[name] = Route(name, adapter_id, version, str(path))
        finally:
            with self._lock:
                self._loading.discard(name)
        return route

    def replace(self, name: str, path: str | Path | None) -> tuple[Route, Route]:
        """Atomically point `name` at the adapter at `path` (None: the policy's own weights).

        Returns (old route, new route). The old adapter is unloaded once its requests finish.
        """
        self.get(name)  # fail before loading anything
        if name == self.policy.served_name and self.policy.trainable:
            raise AdapterConflict(
                f"{name!r} is the training adapter of a running trainer; serve the new adapter under another name"
            )
        if path is None and name != self.policy.served_name:
            raise AdapterConflict(f"only {self.policy.served_name!r} can route to the policy's own weights")
        adapter_id = self._load(path) if path is not None else None
        with self._lock:
            if name not in self._routes:  # removed while the new adapter was loading
                self._retire(adapter_id)
                raise UnknownModel(name, list(self._routes))
            old = self._routes[name]
            version = (old.version or 0) + 1
            new = self._routes[name] = Route(
                name, adapter_id, version, str(path) if path is not None else None
            )
            self._retire(old.adapter_id)
        return old, new

    def remove(self, name: str) -> Route:
        """Stop serving `name`; its adapter is unloaded once its requests finish."""
        with self._lock:
            if name == self.policy.served_name:
                raise AdapterConflict(f"{name!r} is the policy's own model name and cannot be removed")
            route = self._get(name)
            del self._routes[name]
            self._retire(route.adapter_id)
        return route

    def wait_unloaded(self, timeout: float | None = 30.0) -> None:
        """Block until every scheduled unload has finished (tests, shutdown)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for f in pending:
            f.result(timeout=timeout)

    def loaded_ids(self) -> set[str]:
        """Adapter ids the table still holds (routed or draining)."""
        with self._lock:
            return {r.adapter_id for r in self._routes.values() if r.adapter_id} | set(self._retired)

    def _load(self, path: str | Path) -> str:
        model = getattr(self.policy, "model", None)
        if model is not None:
            check_adapter_fits(model, path)
        with self._lock:
            adapter_id = f"adapter_{next(self._ids)}"
        self.policy.adapters.load(path, adapter_id)
        return adapter_id

    def _retire(self, adapter_id: str | None) -> None:
        """Caller holds the lock."""
        if adapter_id is None:
            return
        self._retired.add(adapter_id)
        self._unload_if_drained(adapter_id)

    def _unload_if_drained(self, adapter_id: str) -> None:
        """Caller holds the lock."""
        if adapter_id in self._retired and self._leases[adapter_id] == 0:
            self._retired.discard(adapter_id)
            del self._leases[adapter_id]
            self._pending.append(self._unloader.submit(self.policy.adapters.unload, adapter_id))


def check_adapter_fits(model, path: str | Path) -> None:
    """Fail with a clear error if a LoRA adapter's shapes don't fit `model`, before peft touches it.

    peft injects an adapter's layers before loading its weights, so a mismatch found by peft would
    leave a half-built adapter in a model that is serving requests.
    """
    from safetensors import safe_open

    weights = Path(path) / "adapter_model.safetensors"
    if not weights.is_file():
        return  # e.g. a legacy .bin adapter: peft checks it while loading
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    with safe_open(str(weights), framework="pt") as f:
        for key in f.keys():
            kind = "A" if ".lora_A." in key else "B" if ".lora_B." in key else None
            if kind is None:
                continue
            name = key.split(".lora_")[0].removeprefix("base_model.model.")
            try:
                module = base.get_submodule(name)
            except AttributeError:
                raise ValueError(
                    f"{path}: the adapter targets {name!r}, which this model does not have; was it trained on another base model?"
                ) from None
            got = f.get_slice(key).get_shape()[1 if kind == "A" else 0]
            want = getattr(module, "in_features" if kind == "A" else "out_features", got)
            if got != want:
                raise ValueError(
                    f"{path}: {name} has {want} {'input' if kind == 'A' else 'output'} features but the adapter has {got}; was it trained on another base model?"
                )
