"""The training routes of `grooves serve --train`, OpenAI-style JSON, each on the caller's own models.

    POST   /v1/trainable_models                              {"name", "config"}: create (201)
    GET    /v1/trainable_models                              the caller's models
    GET    /v1/trainable_models/{name}                       one: step, adapter version, settings, checkpoints
    POST   /v1/trainable_models/{name}/steps                 {"step", "groups"}: one training step (idempotent by step id)
    GET    /v1/trainable_models/{name}/checkpoints           kept checkpoints with their steps' metrics
    POST   /v1/trainable_models/{name}/checkpoints/{step}/select   go back to that checkpoint
    DELETE /v1/trainable_models/{name}/checkpoints/{step}    delete one (not the latest)
    POST   /v1/trainable_models/{name}/promote               {"step"?, "served_name"?}: serve a checkpoint, frozen
    GET    /v1/usage                                         the caller's tokens sampled and trained, per model

Sampling is the ordinary `/v1/chat/completions` with `model` set to the trainable model's name:
its live adapter answers, and each choice's `adapter_version` says which step's weights did.

A step's body is parsed, held to the service's limits and hashed on a worker thread
(`Service.read_step`), not on the event loop that answers every other request. A step then runs
as a task of its own that a cancelled request (its client went away) does not stop: the step and
the model's lock end together, so a retry that arrives meanwhile waits for it and then gets its
answer instead of applying the step again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from grooves.remote.wire import TrainRequest
from grooves.serve.errors import APIError
from grooves.serve.keys import caller
from grooves.training_service.core import Service, model_json


class CreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    config: dict[str, Any] = Field(default_factory=dict)
    """The run file's model, lora, rollout, algorithm, optim and logging tables, and its seed;
    `rollout.max_staleness` is how many versions behind the live adapter a submitted turn may be."""
    max_staleness: Any = None
    """The earlier place of `config.rollout.max_staleness`: refused, naming where it went."""


class PromoteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: StrictInt | None = Field(None, ge=0)
    served_name: str | None = None


def service_router(service: Service) -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.post("/trainable_models", status_code=201)
    async def create(body: CreateRequest):
        if body.max_staleness is not None:
            raise APIError(
                400,
                "max_staleness is a field of the run file's [rollout] table, as for `grooves train`: "
                "send it as config.rollout.max_staleness",
                "max_staleness",
            )
        model = await service.create(caller(), body.name, body.config)
        return model_json(model)

    @router.get("/trainable_models")
    async def list_models():
        return {"object": "list", "data": [model_json(m) for m in service.models.of(caller())]}

    @router.get("/trainable_models/{name}")
    async def get_model(name: str):
        return model_json(service.model(caller(), name))

    @router.post("/trainable_models/{name}/steps", openapi_extra=_body_schema(TrainRequest))
    async def train(name: str, request: Request):
        model = service.model(caller(), name)
        body, digest = await asyncio.to_thread(service.read_step, await request.body())
        work = asyncio.ensure_future(service.apply(model, body, digest))
        return await asyncio.shield(work)

    @router.get("/trainable_models/{name}/checkpoints")
    async def checkpoints(name: str):
        model = service.model(caller(), name)
        rows = {r["step"]: r for r in model.log.rows()}
        data = [{"step": s, "metrics": rows.get(s, {})} for s in model.checkpoints()]
        return {"object": "list", "data": data}

    @router.post("/trainable_models/{name}/checkpoints/{step}/select")
    async def select(name: str, step: int):
        model = service.model(caller(), name)
        await service.select(model, step)
        return model_json(model)

    @router.delete("/trainable_models/{name}/checkpoints/{step}")
    async def delete_checkpoint(name: str, step: int):
        model = service.model(caller(), name)
        await service.delete_checkpoint(model, step)
        return {"object": "checkpoint", "model": name, "step": step, "deleted": True}

    @router.post("/trainable_models/{name}/promote")
    async def promote(name: str, body: PromoteRequest | None = None):
        body = body or PromoteRequest()
        return await service.promote(service.model(caller(), name), body.step, body.served_name)

    @router.get("/usage")
    async def usage():
        return service.usage.of(caller())

    return router


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that reads its body itself."""
    schema = model.model_json_schema()  # its own $defs: OpenAPI 3.1 schemas are JSON Schema 2020-12
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
