"""The Tinker API's routes on `grooves serve --train`, under `/api/v1/`, as the `tinker` SDK calls them.

    POST /client/config, /client/dynamic_config   the SDK's settings for this server
    GET  /healthz, /get_server_capabilities        the base model, trainable and sampleable
    POST /create_session, /session_heartbeat, /sessions/{id}/finish
    POST /create_model, /get_info                  a LoRA training model on the base; its tokenizer folder
    POST /forward_backward (protobuf), /optim_step training, in seq_id order per model
    POST /save_weights, /load_weights              states with the optimizer (`save_state`, `load_state*`)
    POST /save_weights_for_sampler, /create_sampling_session, GET /samplers/{id}
    POST /asample                                  token ids, logprobs, stop reasons; prompt logprobs
    POST /retrieve_future                          a request's result, try_again while it runs
    GET/DELETE /training_runs/{id}/checkpoints[/{checkpoint_id}]
    POST /telemetry                                accepted and dropped

Work runs behind a future (`futures.Futures`): the POST answers `{"request_id"}` at once. Input
that cannot run is refused before anything runs: a 400 naming the field, which the SDK raises
(a 404 for a model, session or path the caller does not have). A request that fails while it
runs fails its future with the reason. A training model's requests (`forward_backward`,
`optim_step`, saving and loading its weights) are the exception: once its model and `seq_id` are
read, the request holds that `seq_id`, and input refused after that fails its future (which the
SDK raises) and passes its turn, so the client's later requests, numbered after it, still run.
The SDK sends the key as `X-API-Key`; keys that start with `tml-` (which the SDK requires) work
as any other key of `--api-key` / `--api-keys`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from grooves.serve.errors import APIError
from grooves.serve.keys import caller
from grooves.training_service.tinker.codec import BadInput, read_forward_backward, read_turn
from grooves.training_service.tinker.futures import RequestFailed, Result
from grooves.training_service.tinker.server import EPHEMERAL, TinkerService
from grooves.training_service.tinker.training import AdamStep, LoraSettings

PROTOBUF = "application/x-protobuf"
B = TypeVar("B", bound=BaseModel)


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class LoraConfigBody(_Loose):
    rank: StrictInt = Field(ge=1, le=256)
    seed: StrictInt | None = None
    train_unembed: StrictBool = True
    train_mlp: StrictBool = True
    train_attn: StrictBool = True


class CreateModelBody(_Loose):
    session_id: str
    model_seq_id: StrictInt = Field(ge=0)
    base_model: str
    lora_config: LoraConfigBody | None = None
    optimizer_config: dict[str, Any] | None = None


class AdamBody(_Loose):
    learning_rate: float = Field(1e-4, ge=0, allow_inf_nan=False)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-12, gt=0, allow_inf_nan=False)
    weight_decay: float = Field(0.0, ge=0, allow_inf_nan=False)
    grad_clip_norm: float = Field(0.0, allow_inf_nan=False)


class TurnBody(_Loose):
    """Where a training request goes in its model's order: read before the rest of the body."""

    model_id: str
    seq_id: StrictInt


class OptimBody(TurnBody):
    adam_params: AdamBody | None = None
    optimizer_params: dict[str, Any] | None = None


class SaveBody(TurnBody):
    path: str | None = None
    overwrite: StrictBool = False
    sampling_session_seq_id: StrictInt | None = None


class LoadBody(_Loose):
    path: str
    optimizer: StrictBool
    model_id: str | None = None
    seq_id: StrictInt | None = None
    session_id: str | None = None
    model_seq_id: StrictInt | None = None
    base_model: str | None = None


def _body(model: type[BaseModel], data: Any):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        raise APIError(400, f"{where}: {err['msg']}", where) from None


async def _json(request: Request) -> Any:
    return _parse(await request.body())


def _parse(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        raise APIError(400, "the body is not JSON", "body") from None


def tinker_router(tinker: TinkerService) -> APIRouter:
    """The Tinker API under /api/v1, route group by route group."""
    router = APIRouter(prefix="/api/v1")
    futures = _Futures(tinker)
    for routes in (
        _client_routes,
        _session_routes,
        _model_routes,
        _training_routes,
        _weights_routes,
        _sampling_routes,
        _future_routes,
    ):
        routes(router, tinker, futures)
    return router


class _Futures:
    """The SDK's futures: work submitted now, its result retrieved later by request id."""

    def __init__(self, tinker: TinkerService):
        self.tinker = tinker

    def future(self, model_id: str | None, work, **extra) -> dict[str, Any]:
        """`work` submitted as the caller's future: the SDK retrieves its result by request id."""
        return {"request_id": self.tinker.futures.submit(caller(), work), "model_id": model_id, **extra}

    def ordered(
        self, model, seq_id: int, body: bytes, check: Callable[[], Callable[[], Result]]
    ) -> dict[str, Any]:
        """A future that runs in the model's seq_id order on the model workers. `seq_id` is taken
        first: a used one is a 400 now, unless `body` is that request's own, sent again (its future
        again). Then `check()` reads the rest of the request on a thread, while earlier requests
        run, and returns the work; a request it refuses (`BadInput`, `APIError`) fails its future
        with the reason when its turn comes, as does a `BadInput` the work raises before it changes
        anything, and the turn passes, so the later ids run."""
        tinker = self.tinker
        order = tinker.orders[model.model_id]
        digest = hashlib.sha256(body).hexdigest()
        again = order.resent(seq_id, digest)
        if again is not None:
            return {"request_id": again, "model_id": model.model_id}
        try:
            order.claim(seq_id)
        except ValueError as exc:
            raise APIError(400, str(exc), "seq_id", "bad_seq_id") from None

        async def run():
            checking = asyncio.ensure_future(asyncio.to_thread(check))

            async def turn():
                try:
                    return await tinker.run(await checking)
                except (BadInput, APIError) as exc:
                    raise RequestFailed(str(exc)) from None

            return await order.run(seq_id, turn)

        answer = self.future(model.model_id, run)
        order.remember(seq_id, digest, answer["request_id"])
        return answer

    def ordered_json(
        self, raw: bytes, body_type: type[B], work: Callable[[Any, B], Result]
    ) -> dict[str, Any]:
        """A JSON training request in its model's order (`ordered`): its model and seq_id read first,
        the rest of it (`body_type`) checked in its future, then `work(model, body)` on the workers."""
        data = _parse(raw)
        at = _body(TurnBody, data)
        model = self.tinker.model(caller(), at.model_id)

        def check():
            body = _body(body_type, data)
            return lambda: work(model, body)

        return self.ordered(model, at.seq_id, raw, check)


def _client_routes(router: APIRouter, tinker: TinkerService, futures: _Futures) -> None:
    """The SDK's settings, health and capabilities."""
    service = tinker.service

    @router.post("/client/config")
    async def client_config():
        return {
            "pjwt_auth_enabled": False,
            "parallel_fwdbwd_chunks": True,
            "proto_compress_fwdbwd": False,
            "fwdbwd_max_chunk_bytes_count": 4 * service.limits.max_step_tokens,
            "use_pyqwest_transport": False,
            "sample_use_retrieve_futures": False,
            "sample_join_sampling_session": False,
            "custom_loss_server_side": False,
        }

    @router.post("/client/dynamic_config")
    async def dynamic_config():
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @router.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @router.get("/get_server_capabilities")
    async def capabilities():
        context = service.base_policy.prompts.max_context
        model = {
            "model_name": tinker.base_name,
            "max_context_length": context,
            "trainable": True,
            "sampleable": True,
        }
        return {"supported_models": [model]}

    @router.post("/telemetry")
    async def telemetry():
        return {"status": "accepted"}


def _session_routes(router: APIRouter, tinker: TinkerService, futures: _Futures) -> None:
    """Sessions: create, heartbeat, finish."""

    @router.post("/create_session")
    async def create_session():
        return {"type": "create_session", "session_id": tinker.create_session(caller()).session_id}

    @router.post("/session_heartbeat")
    async def heartbeat(request: Request):
        body = await _json(request)
        tinker.session(caller(), str(body.get("session_id") if isinstance(body, dict) else ""))
        return {"type": "session_heartbeat"}

    @router.post("/sessions/{session_id}/finish")
    async def finish(session_id: str):
        tinker.finish(caller(), session_id)
        return None


def _model_routes(router: APIRouter, tinker: TinkerService, futures: _Futures) -> None:
    """Training models: create one, its info."""
    future = futures.future

    @router.post("/create_model")
    async def create_model(request: Request):
        body = _body(CreateModelBody, await _json(request))
        _adam_only(body.optimizer_config)
        base = tinker.check_base(body.base_model)
        lora = body.lora_config or LoraConfigBody(rank=32)
        if not (lora.train_attn or lora.train_mlp):
            raise APIError(
                400,
                "lora_config: train_attn and train_mlp are both off; grooves adapts those layers",
                "lora_config",
            )
        settings = LoraSettings(
            base, lora.rank, lora.seed or 0, lora.train_attn, lora.train_mlp, lora.train_unembed
        )
        tinker.session(caller(), body.session_id)

        async def run():
            model = await tinker.create_model(caller(), body.session_id, body.model_seq_id, settings)
            return {"type": "create_model", "model_id": model.model_id}

        return future(None, run)

    @router.post("/get_info")
    async def get_info(request: Request):
        body = await _json(request)
        model = tinker.model(caller(), str(body.get("model_id") if isinstance(body, dict) else ""))
        s = model.settings
        data = {"arch": "llama", "model_name": s.base_model, "tokenizer_id": tinker.tokenizer_path}
        return {
            "type": "get_info",
            "model_id": model.model_id,
            "model_data": data,
            "is_lora": True,
            "lora_rank": s.rank,
            "model_name": s.base_model,
        }


def _training_routes(router: APIRouter, tinker: TinkerService, futures: _Futures) -> None:
    """forward_backward and optim_step, each a future in the model's seq_id order."""
    ordered = futures.ordered

    @router.post("/forward_backward")
    async def forward_backward(request: Request):
        if request.headers.get("content-encoding", "identity") not in ("identity", ""):
            raise APIError(415, "a compressed body is not supported here; send it uncompressed", "body")
        body = await request.body()
        try:
            model_id, seq_id = await asyncio.to_thread(read_turn, body)
        except BadInput as exc:
            raise APIError(400, str(exc), "data", "bad_input") from None
        model = tinker.model(caller(), model_id)

        def check():
            req = read_forward_backward(body, vocab_size=model.vocab_size)
            _check_lengths(tinker, model, req)
            return lambda: model.forward_backward(req)

        return ordered(model, seq_id, body, check)

    @router.post("/optim_step")
    async def optim_step(request: Request):
        def step(model, body: OptimBody) -> Result:
            if body.optimizer_params is not None:
                raise BadInput("optimizer_params: only Adam (adam_params) is supported here")
            return model.optim_step(AdamStep(**(body.adam_params or AdamBody()).model_dump()))

        return futures.ordered_json(await request.body(), OptimBody, step)


def _weights_routes(router: APIRouter, tinker: TinkerService, futures: _Futures) -> None:
    """Saved states and sampler weights: save, load, list, delete."""
    future = futures.future
    ordered_json = futures.ordered_json

    @router.post("/save_weights")
    async def save_weights(request: Request):
        def save(model, body: SaveBody) -> Result:
            name = body.path or f"{body.seq_id:06d}"
            folder = tinker.new_weights_folder(model, "weights", name, overwrite=body.overwrite)
            model.save_state(folder)
            return {"type": "save_weights", "path": tinker.path_of(model.model_id, "weights", name)}

        return ordered_json(await request.body(), SaveBody, save)

    @router.post("/save_weights_for_sampler")
    async def save_for_sampler(request: Request):
        tenant = caller()

        def save(model, body: SaveBody) -> Result:
            name = body.path if body.path is not None else f"{EPHEMERAL}{body.seq_id}"
            folder = tinker.new_weights_folder(model, "sampler_weights", name)
            version = model.save_sampler(folder)
            path = tinker.path_of(model.model_id, "sampler_weights", name)
            tinker.samplers.saved(tenant, path, model, version)
            out = {"type": "save_weights_for_sampler", "path": path}
            if body.path is None:  # unnamed: a sampling session comes with it
                tinker.prune_ephemeral(model)
                session = tinker.samplers.open(tenant, model.settings.base_model, path, folder)
                out["sampling_session_id"] = session.session_id
            return out

        return ordered_json(await request.body(), SaveBody, save)

    @router.post("/load_weights")
    async def load_weights(request: Request):
        raw = await request.body()
        data = _parse(raw)
        tenant = caller()
        if not isinstance(data, dict) or data.get("session_id") is None:  # into a live model
            if not isinstance(data, dict) or data.get("model_id") is None or data.get("seq_id") is None:
                raise APIError(
                    400, "load_weights needs model_id and seq_id, or session_id and model_seq_id", "model_id"
                )

            def load(model, body: LoadBody) -> Result:
                _, _, _, folder = tinker.resolve(tenant, body.path, "weights")
                model.load_state(folder, optimizer=body.optimizer)
                return {"type": "load_weights", "path": body.path, "model_id": model.model_id}

            return ordered_json(raw, LoadBody, load)
        # create-via-load: a new model, its settings from the state
        body = _body(LoadBody, data)
        session_id, model_seq_id = body.session_id, body.model_seq_id
        if session_id is None or model_seq_id is None:
            raise APIError(400, "model_seq_id: needed with session_id", "model_seq_id")
        tinker.session(tenant, session_id)

        async def create_from_state():
            _, _, _, folder = tinker.resolve(tenant, body.path, "weights")
            settings = tinker.settings_of(folder)
            if body.base_model is not None:
                tinker.check_base(body.base_model)
            model = await tinker.create_model(tenant, session_id, model_seq_id, settings)
            await tinker.run(lambda: model.load_state(folder, optimizer=body.optimizer))
            return {"type": "load_weights", "path": body.path, "model_id": model.model_id}

        return future(None, create_from_state)

    @router.get("/training_runs/{model_id}/checkpoints")
    async def list_checkpoints(model_id: str):
        return {"checkpoints": tinker.checkpoints(caller(), model_id)}

    @router.delete("/training_runs/{model_id}/checkpoints/{checkpoint_id:path}")
    async def delete_checkpoint(model_id: str, checkpoint_id: str):
        await asyncio.to_thread(tinker.delete_checkpoint, caller(), model_id, checkpoint_id)
        return None


def _sampling_routes(router: APIRouter, tinker: TinkerService, futures: _Futures) -> None:
    """Sampling sessions and their samples."""
    future = futures.future

    @router.post("/create_sampling_session")
    async def create_sampling_session(request: Request):
        body = await _json(request)
        if not isinstance(body, dict):
            raise APIError(400, "the body must be a JSON object", "body")
        tenant = caller()
        tinker.session(tenant, str(body.get("session_id")))
        path = body.get("model_path")
        if path:
            try:
                model_id, _, _, folder = tinker.resolve(tenant, path, "sampler_weights")
            except RequestFailed as exc:
                raise APIError(404, str(exc), "model_path", "model_not_found") from None
            settings_base = tinker.check_base(body.get("base_model"))
            session = tinker.samplers.open(tenant, settings_base, path, folder)
        else:
            session = tinker.samplers.open(tenant, tinker.check_base(body.get("base_model")), None, None)
        return {"type": "create_sampling_session", "sampling_session_id": session.session_id}

    @router.get("/samplers/{session_id}")
    async def get_sampler(session_id: str):
        try:
            s = tinker.samplers.get(caller(), session_id)
        except KeyError:
            raise APIError(404, f"no sampler {session_id!r}", "sampler_id", "sampler_not_found") from None
        return {"sampler_id": s.session_id, "base_model": s.base_model, "model_path": s.model_path}

    @router.post("/asample")
    async def asample(request: Request):
        body = await _json(request)
        if not isinstance(body, dict):
            raise APIError(400, "the body must be a JSON object", "body")
        tenant = caller()
        if body.get("sampling_session_id"):
            try:
                session = tinker.samplers.get(tenant, body["sampling_session_id"])
            except KeyError:
                raise APIError(
                    404, f"no sampling session {body['sampling_session_id']!r}", "sampling_session_id"
                ) from None
        elif body.get("model_path"):
            try:
                _, _, _, folder = tinker.resolve(tenant, body["model_path"], "sampler_weights")
            except RequestFailed as exc:
                raise APIError(404, str(exc), "model_path", "model_not_found") from None
            session = tinker.samplers.open(
                tenant, tinker.check_base(body.get("base_model")), body["model_path"], folder
            )
        else:
            session = tinker.samplers.open(tenant, tinker.check_base(body.get("base_model")), None, None)
        n = body.get("num_samples", 1)

        async def run():
            try:
                return await tinker.run(lambda: tinker.samplers.sample(session, body))
            except BadInput as exc:
                raise RequestFailed(str(exc)) from None

        ids = [uuid.uuid4().hex for _ in range(n if isinstance(n, int) and 0 < n <= tinker.max_n else 1)]
        return future(None, run, sample_sequence_ids=ids)


def _future_routes(router: APIRouter, tinker: TinkerService, futures: _Futures) -> None:
    """retrieve_future: a future's result, once it is ready."""

    @router.post("/retrieve_future")
    async def retrieve_future(request: Request):
        body = await _json(request)
        request_id = str(body.get("request_id") if isinstance(body, dict) else "")
        try:
            result = await tinker.futures.retrieve(caller(), request_id)
        except KeyError:
            raise APIError(404, f"no request {request_id!r}", "request_id", "request_not_found") from None
        if result is None:
            return {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        if isinstance(result, bytes):
            return Response(result, media_type=PROTOBUF)
        return JSONResponse(result)


def _adam_only(config: dict[str, Any] | None) -> None:
    kind = (config or {}).get("type", "adamw")
    if kind != "adamw":
        raise APIError(
            400, f"optimizer_config.type: {kind!r}; only Adam ('adamw') is supported here", "optimizer_config"
        )


def _check_lengths(tinker: TinkerService, model, req) -> None:
    """Each datum within what one training sequence may hold here; the request within --max-step-tokens."""
    limits = tinker.service.limits
    if req.num_tokens > limits.max_step_tokens:
        raise BadInput(
            f"data: {req.num_tokens} tokens in one request, more than this service's {limits.max_step_tokens} "
            "(--max-step-tokens)"
        )
    bounds = tinker.service.sequence_bounds(model.hosted)
    bound = min(bounds, key=lambda b: b.tokens)
    for i, d in enumerate(req.data):
        if len(d.tokens) > bound.tokens:
            raise BadInput(f"data[{i}].model_input: {len(d.tokens)} tokens, more than {bound.what}")
