"""How the chat completions API of a training service reaches each tenant's models.

The service's app is the ordinary `serve.create_app` over two objects made here:

- `ServicePolicy`, the app's policy: the base policy's parts (prompt rendering, tokenizer, extra
  adapters), except that a sampling batch for a trainable model's adapter id runs on that model's
  own policy (its live adapter, folded for sampling like the trainer's);
- `ServiceTable`, the app's adapter table: the names a request may send are the caller's
  (`serve.keys.caller()`) trainable models and promoted adapters, and the operator's (the base
  model and `--adapter` names); another tenant's names do not exist for it (404, and not listed).

Tenants have separate namespaces: two tenants may each have a model `capitals`. A promoted adapter
is an ordinary route of the table under an internal name that starts with `OWNED`, mapped back to
the name its tenant gave it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from grooves.policy.sampling import Completion, SamplingParams
from grooves.serve.keys import caller
from grooves.serve.routing import ModelRoutes, Route, UnknownModel
from grooves.training_service.hosted import HostedModel

OWNED = "\x00"
"""Internal route names of promoted adapters start with this (no request can send it)."""


class Models:
    """The hosted models, by (tenant, name) and by adapter id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[tuple[str, str], HostedModel] = {}
        self._by_adapter: dict[str, HostedModel] = {}

    def add(self, model: HostedModel) -> None:
        with self._lock:
            self._by_key[(model.tenant, model.name)] = model
            self._by_adapter[model.adapter_id] = model

    def get(self, tenant: str, name: str) -> HostedModel | None:
        with self._lock:
            return self._by_key.get((tenant, name))

    def of(self, tenant: str) -> list[HostedModel]:
        with self._lock:
            return [m for (t, _), m in sorted(self._by_key.items()) if t == tenant]

    def all(self) -> list[HostedModel]:
        with self._lock:
            return list(self._by_key.values())

    def by_adapter(self, adapter_id: str | None) -> HostedModel | None:
        with self._lock:
            return self._by_adapter.get(adapter_id) if adapter_id else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_key)


class ServicePolicy:
    """The app's `Policy`: the base policy's parts, with trainable models' batches sent to their own policies."""

    trainable = False

    def __init__(self, base, models: Models):
        self.base, self.models = base, models
        self.served_name = base.served_name
        self.tokenizer = base.tokenizer
        self.generator = base.generator
        self.lock = base.lock
        self.prompts = base.prompts
        self.adapters = base.adapters

    @property
    def model(self):
        return self.base.model

    def generate(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        adapter: str | None = None,
        cancelled: Sequence[Callable[[], bool]] | None = None,
    ) -> list[list[Completion]]:
        hosted = self.models.by_adapter(adapter)
        if hosted is not None:  # the model's own weights: its live adapter
            return hosted.policy.generate(prompts, params, None, cancelled)
        return self.base.generate(prompts, params, adapter, cancelled)

    def training_phase(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # never trained: each trainable model trains its own policy


def owned_name(tenant: str, name: str) -> str:
    """The table's internal name of tenant `tenant`'s promoted adapter `name`."""
    return f"{OWNED}{tenant}/{name}"


class ServiceTable(ModelRoutes):
    """The adapter table as the calling tenant sees it (see the module docstring)."""

    def __init__(self, policy: ServicePolicy, models: Models, *, own_path: str | None = None):
        super().__init__(policy, own_path=own_path)
        self.models = models

    def routes(self) -> list[Route]:
        tenant = caller()
        out = []
        for route in super().routes():
            if not route.name.startswith(OWNED):
                out.append(route)
            elif route.name.startswith(owned_name(tenant, "")):
                out.append(replace(route, name=route.name.removeprefix(owned_name(tenant, ""))))
        out += [Route(m.name, m.adapter_id, None, None) for m in self.models.of(tenant)]
        return out

    def names(self) -> list[str]:
        return [r.name for r in self.routes()]

    def get(self, name: str) -> Route:
        model = self.models.get(caller(), name)
        if model is not None:
            return Route(model.name, model.adapter_id, None, None)
        try:
            return super().get(self._internal(name))
        except UnknownModel:
            raise UnknownModel(name, self.names()) from None

    @contextmanager
    def lease(self, name: str) -> Iterator[Route]:
        model = self.models.get(caller(), name)
        if model is not None:  # a trainable model is never unloaded: nothing to lease
            yield Route(model.name, model.adapter_id, None, None)
            return
        try:
            lease = super().lease(self._internal(name))
            route = lease.__enter__()
        except UnknownModel:
            raise UnknownModel(name, self.names()) from None
        try:
            yield route
        finally:
            lease.__exit__(None, None, None)

    def version_of(self, route: Route) -> int:
        model = self.models.by_adapter(route.adapter_id)
        if model is not None:
            return model.step
        return super().version_of(route)

    def owns(self, tenant: str, name: str) -> bool:
        """`name` is a promoted adapter of `tenant`."""
        return owned_name(tenant, name) in super().names()

    def _internal(self, name: str) -> str:
        """The route name behind what the caller sent: its own promoted adapter, else the operator's name."""
        owned = owned_name(caller(), name)
        return owned if owned in super().names() else name
