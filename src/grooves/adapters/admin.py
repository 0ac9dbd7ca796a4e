"""HTTP admin endpoints of a multi-adapter server: load, unload, promote and roll back adapters.

    GET    /v1/adapters                      routes, in-flight requests, promotion history
    POST   /v1/adapters                      {"name", "path"}: serve a new name
    DELETE /v1/adapters/{name}               stop serving a name (unloaded once drained)
    POST   /v1/adapters/{name}/promote       {"path"}: replace its adapter atomically
    POST   /v1/adapters/{name}/rollback      back to what it served before the last promotion

`path` is resolved on the server like every adapter command's SOURCE: an adapter folder, a
checkpoint folder, or a run folder with `select` = latest | best | step (and `metric`, `mode`).
Loading reads files and waits for the sampler's lock, so it runs on a worker thread; the event
loop keeps answering requests meanwhile. These endpoints change what the server runs and read any
path on its disk, so an app has them only when its owner mounts them (`mount_admin`; `grooves
serve` does only with `--admin`, and with `--api-key` they need the key like every route); the
trainer's own server never does.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import asdict
from typing import Literal

from fastapi import APIRouter, FastAPI
from pydantic import BaseModel, ConfigDict, Field

from grooves.adapters.promote import NothingToRollBack, Promoter
from grooves.adapters.registry import (
    DEFAULT_METRIC,
    AdapterNotFound,
    BadAdapter,
    check_adapter_finite,
    resolve_adapter,
)
from grooves.serve.errors import APIError
from grooves.serve.routing import AdapterConflict, ModelRoutes, Route, UnknownModel

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


class AdapterSource(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1)
    select: str = "latest"
    metric: str = DEFAULT_METRIC
    mode: Literal["max", "min"] = "max"


class NewAdapter(AdapterSource):
    name: str


def route_json(table: ModelRoutes, route: Route, promoter: Promoter | None = None) -> dict:
    body = {
        **asdict(route),
        "version": table.version_of(route),
        "in_flight": table.in_flight(route.adapter_id) if route.adapter_id else None,
    }
    if promoter is not None:
        body["history"] = promoter.history(route.name)
    return body


def _resolve(source: AdapterSource) -> str:
    """The adapter folder `source` names; one whose weights hold NaN or inf is refused (400)."""
    try:
        path = resolve_adapter(source.path, source.select, source.metric, source.mode)
        check_adapter_finite(path)
    except (AdapterNotFound, BadAdapter, ValueError) as exc:
        raise APIError(400, str(exc), "path") from exc
    return str(path)


async def _call(fn, *args):
    """Run a table/promoter call off the event loop and map its errors to HTTP ones."""
    try:
        return await asyncio.to_thread(fn, *args)
    except UnknownModel as exc:
        raise APIError(404, str(exc), "name", "model_not_found") from exc
    except (AdapterConflict, NothingToRollBack) as exc:
        raise APIError(409, str(exc), "name", "conflict") from exc
    except (
        ValueError,
        RuntimeError,
        OSError,
    ) as exc:  # peft/torch: an adapter that does not fit this base model
        raise APIError(400, f"could not load the adapter: {exc}", "path") from exc


def admin_router(table: ModelRoutes, promoter: Promoter) -> APIRouter:
    router = APIRouter(prefix="/v1/adapters")

    @router.get("")
    async def list_adapters():
        return {"object": "list", "data": [route_json(table, r, promoter) for r in table.routes()]}

    @router.post("", status_code=201)
    async def add_adapter(body: NewAdapter):
        if not _NAME.match(body.name):
            raise APIError(400, f"name {body.name!r} must match {_NAME.pattern}", "name")
        route = await _call(table.add, body.name, _resolve(body))
        return route_json(table, route, promoter)

    @router.delete("/{name:path}")
    async def remove_adapter(name: str):
        route = await _call(table.remove, name)
        return {**route_json(table, route), "deleted": True}

    @router.post("/{name:path}/promote")
    async def promote(name: str, body: AdapterSource):
        route = await _call(promoter.promote, name, _resolve(body))
        return route_json(table, route, promoter)  # history[-1] is what it served before

    @router.post("/{name:path}/rollback")
    async def rollback(name: str):
        route = await _call(promoter.rollback, name)
        return route_json(table, route, promoter)

    return router


def mount_admin(app: FastAPI) -> Promoter:
    """Add the /v1/adapters endpoints to an app from `serve.create_app`, over its adapter table;
    returns the `Promoter` behind them (also `app.state.promoter`)."""
    promoter = Promoter(app.state.adapters)
    app.state.promoter = promoter
    app.include_router(admin_router(app.state.adapters, promoter))
    return promoter
