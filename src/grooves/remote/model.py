"""`TrainableModel`: a model on a training service (`grooves serve --train`), from the user's own loop.

The loop is plain Python on the user's machine: sample through `openai_client()` (any agent code
that speaks the OpenAI API), score locally (code, a judge, an environment), then `train(groups)`
sends the groups' token records for one optimizer step on the service and returns its metrics
and the new adapter version, which answers the next request at once.

    model = await TrainableModel.create("http://127.0.0.1:8000", "capitals", "examples/capitals.toml")
    for step in range(1, 21):
        groups = await model.gather(task.rollout, stream.take(4))   # seeded like the trainer's
        result = await model.train(groups)
        print(step, result.metrics["reward_mean"], result.adapter_version)
    await model.promote()                                           # serve the last checkpoint

`gather` runs rollouts as the trainer does (`grooves.rollouts.gather`: bounded concurrency, a seed per
rollout from (run seed, step, group, rollout), a rollout that raises recorded as a failed
trajectory), so a loop driven through the service samples what the in-process trainer would.

Every step carries a step id (the model's applied steps + 1). `train` retries a request whose
answer was lost (a dropped connection, a timeout, a 502/503/504) with the same id; the service
applies a step id once and answers a repeat with the first answer, so a retry never trains twice.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from grooves.config import RunConfig, load_config, parse_config
from grooves.core.trajectory import TrajectoryGroup
from grooves.remote.wire import to_records
from grooves.rollouts.gather import RolloutFn, gather
from grooves.rollouts.handle import ModelHandle

SERVICE_SECTIONS = ("seed", "model", "lora", "rollout", "algorithm", "optim", "logging", "checkpoint")
"""The run-file fields a trainable model takes; the rest of a run file (the task, validation, the
watch, steps) belongs to the user's loop."""
_RETRY_STATUS = (502, 503, 504)


class ServiceError(RuntimeError):
    """An error answer of the service: `status`, and OpenAI's `message`, `param` and `code`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message, self.param, self.code = status, message, param, code


@dataclass(frozen=True)
class StepResult:
    step: int
    """The step id that was applied."""
    adapter_version: int
    """The version of the model's adapter after the step: what the next request samples."""
    metrics: dict[str, Any]
    """The step's row of the model's metrics.jsonl on the service (the trainer's metric keys)."""
    replayed: bool = False
    """True when the step had already been applied (a retried request): nothing changed."""


def run_config(config: RunConfig | Mapping[str, Any] | str | Path | None) -> RunConfig:
    """A `RunConfig` from a run file's path, its tables as a dict, a `RunConfig`, or None (defaults)."""
    if config is None:
        return RunConfig()
    if isinstance(config, RunConfig):
        return config
    if isinstance(config, str | Path):
        return load_config(config)
    return parse_config(dict(config))


def service_sections(config: RunConfig, *, set_only: bool = False) -> dict[str, Any]:
    """The part of a run file a trainable model is created with (`SERVICE_SECTIONS`); `set_only`:
    only the fields the file (or code) set, so the service fills the rest (its base model, say)."""
    data = config.model_dump(mode="json", exclude_none=True, exclude_unset=set_only)
    return {k: data[k] for k in SERVICE_SECTIONS if k in data}


def _agrees(full: Any, given: Any) -> bool:
    """Every field of `given` (a subset of the sections) has the same value in `full`."""
    if isinstance(given, dict):
        return isinstance(full, dict) and all(k in full and _agrees(full[k], v) for k, v in given.items())
    return full == given


class TrainableModel:
    """One trainable model of a training service. Build it with `create` or `connect`."""

    def __init__(
        self,
        base_url: str,
        name: str,
        config: RunConfig,
        *,
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 60.0,
        train_timeout: float = 600.0,
    ):
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.name = name
        self.config = config
        self.api_key = api_key
        self.train_timeout = train_timeout
        self.step = 0
        """Steps applied so far (the next step id is `step + 1`)."""
        self.adapter_version = 0
        self._transport = transport
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )
        self._openai = None

    # ---- building ----------------------------------------------------------------------------
    @classmethod
    async def create(
        cls,
        base_url: str,
        name: str,
        config: RunConfig | Mapping[str, Any] | str | Path | None = None,
        *,
        api_key: str | None = None,
        exist_ok: bool = False,
        **options,
    ) -> TrainableModel:
        """Create `name` on the service with `config`'s model, lora, rollout, algorithm, optim,
        logging and checkpoint sections and seed (a run file's path, its tables as a dict, or a `RunConfig`).

        `config`'s `rollout.max_staleness` is how many versions behind the live adapter a submitted
        turn may be (0: on-policy), the bound `grooves train` holds its steps to. `exist_ok`: a model of that name created with the same settings
        is connected to instead of refused (a loop that restarts). `options`: `transport`,
        `timeout`, `train_timeout` (seconds a training step may take).
        """
        if "max_staleness" in options:
            raise TypeError(
                "TrainableModel.create: max_staleness is the run file's rollout.max_staleness, "
                'as for `grooves train`: set it in config (e.g. {"rollout": {"max_staleness": 1}})'
            )
        config = run_config(config)
        model = cls(base_url, name, config, api_key=api_key, **options)
        body = {
            "name": name,
            "config": service_sections(config, set_only=True),
        }
        try:
            info = await model._call("POST", "/v1/trainable_models", json=body)
        except ServiceError as exc:
            if not (exist_ok and exc.code == "model_exists"):
                await model.close()
                raise
            info = await model._call("GET", f"/v1/trainable_models/{name}")
            if not _agrees(info["config"], body["config"]):
                await model.close()
                raise ServiceError(
                    409,
                    f"model {name!r} exists with other settings; pick another name",
                    "config",
                    "model_exists",
                ) from None
        model._update(info)
        return model

    @classmethod
    async def connect(
        cls, base_url: str, name: str, *, api_key: str | None = None, **options
    ) -> TrainableModel:
        """The existing model `name` (after a restart of the loop or of the service), at its current step."""
        model = cls(base_url, name, RunConfig(), api_key=api_key, **options)
        try:
            info = await model._call("GET", f"/v1/trainable_models/{name}")
        except ServiceError:
            await model.close()
            raise
        model.config = parse_config(info["config"])
        model._update(info)
        return model

    def _update(self, info: dict[str, Any]) -> None:
        self.step, self.adapter_version = int(info["step"]), int(info["adapter_version"])

    # ---- sampling ----------------------------------------------------------------------------
    def openai_client(self):
        """An `openai.AsyncOpenAI` pointing at the service, with this model's key; send `model=self.name`."""
        if self._openai is None:
            from openai import AsyncOpenAI

            http = httpx.AsyncClient(transport=self._transport, timeout=self.train_timeout)
            self._openai = AsyncOpenAI(
                base_url=f"{self.base_url}/v1", api_key=self.api_key or "unused", http_client=http
            )
        return self._openai

    def handle(self, *, temperature: float | None = None, seed: int | None = None) -> ModelHandle:
        """A `ModelHandle` (what a task's rollout receives) with the run file's rollout settings;
        `seed` defaults to the run's (the trainer's validation uses seed + 1 and its own temperature)."""
        r = self.config.rollout
        return ModelHandle(
            self.openai_client(),
            self.name,
            r.temperature if temperature is None else temperature,
            r.top_p,
            r.max_tokens,
            seed=self.config.seed if seed is None else seed,
        )

    async def gather(
        self,
        rollout: RolloutFn,
        scenarios: Sequence[dict[str, Any]],
        *,
        step: int | None = None,
        group_size: int | None = None,
        handle: ModelHandle | None = None,
        max_failure_fraction: float | None = None,
    ) -> list[TrajectoryGroup]:
        """`group_size` rollouts of each scenario as the trainer runs them for step `step` (default:
        the next one): the same per-rollout seeds, concurrency and failure handling
        (`grooves.rollouts.gather`). A validation pass gives its own `handle` and a failure limit of 1."""
        r = self.config.rollout
        step = self.step + 1 if step is None else step
        return await gather(
            rollout,
            handle or self.handle(),
            scenarios,
            group_size or r.group_size,
            concurrency=r.concurrency,
            max_failure_fraction=r.max_failure_fraction
            if max_failure_fraction is None
            else max_failure_fraction,
            progress=self.config.logging.progress,
            description=f"step {step} rollouts",
            seed_key=(step,),
        )

    # ---- training ----------------------------------------------------------------------------
    async def train(
        self, groups: Sequence[TrajectoryGroup], *, step: int | None = None, retries: int = 3
    ) -> StepResult:
        """One optimizer step on the service with `groups` (step id: the next one unless given).

        A request whose answer is lost is sent again with the same step id, up to `retries` times;
        the service applies each step id once. Raises `ServiceError` for a refused step (a 4xx
        naming the field: a token id outside the vocabulary, a turn from an adapter version the
        model does not take, a step id that is not the next one).
        """
        step = self.step + 1 if step is None else step
        body = json.dumps({"step": step, "groups": to_records(groups)}, separators=(",", ":"))
        path = f"/v1/trainable_models/{self.name}/steps"
        for attempt in range(retries + 1):
            try:
                info = await self._call(
                    "POST",
                    path,
                    content=body,
                    headers={"Content-Type": "application/json"},
                    timeout=self.train_timeout,
                )
                break
            except (httpx.TransportError, ServiceError) as exc:
                lost = isinstance(exc, httpx.TransportError) or exc.status in _RETRY_STATUS
                if not lost or attempt == retries:
                    raise
                await asyncio.sleep(min(2.0**attempt, 10.0))
        self.step, self.adapter_version = int(info["step"]), int(info["adapter_version"])
        return StepResult(info["step"], info["adapter_version"], info["metrics"], info.get("replayed", False))

    # ---- checkpoints, promotion, usage -------------------------------------------------------
    async def info(self) -> dict[str, Any]:
        """The model as the service describes it (step, adapter version, settings)."""
        info = await self._call("GET", f"/v1/trainable_models/{self.name}")
        self._update(info)
        return info

    async def checkpoints(self) -> list[dict[str, Any]]:
        """The model's kept checkpoints, oldest first: `step` and the step's metrics."""
        return (await self._call("GET", f"/v1/trainable_models/{self.name}/checkpoints"))["data"]

    async def select(self, step: int) -> dict[str, Any]:
        """Go back to checkpoint `step`: the adapter, optimizer and step count as they were then;
        the checkpoints after it are deleted, and the next step id is `step + 1`."""
        info = await self._call("POST", f"/v1/trainable_models/{self.name}/checkpoints/{step}/select")
        self._update(info)
        return info

    async def delete_checkpoint(self, step: int) -> None:
        """Delete checkpoint `step` (not the latest: a restart of the service comes back to it)."""
        await self._call("DELETE", f"/v1/trainable_models/{self.name}/checkpoints/{step}")

    async def promote(self, step: int | None = None, served_name: str | None = None) -> dict[str, Any]:
        """Serve checkpoint `step` (default: the latest) as a frozen adapter named `served_name`
        (default: `<name>-promoted`), beside the base on the same service; promoting again
        replaces it atomically. Returns the served route (its `name` is what requests send)."""
        body = {k: v for k, v in {"step": step, "served_name": served_name}.items() if v is not None}
        return await self._call("POST", f"/v1/trainable_models/{self.name}/promote", json=body)

    async def usage(self) -> dict[str, Any]:
        """Tokens sampled and trained by this key, per model."""
        return await self._call("GET", "/v1/usage")

    async def close(self) -> None:
        await self._http.aclose()
        if self._openai is not None:
            await self._openai.close()

    async def __aenter__(self) -> TrainableModel:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _call(self, method: str, path: str, **kwargs) -> dict[str, Any]:
        resp = await self._http.request(method, path, **kwargs)
        try:
            body = resp.json()
        except ValueError:
            body = {}
        if resp.status_code >= 400:
            err = body.get("error", {}) if isinstance(body, dict) else {}
            raise ServiceError(
                resp.status_code, err.get("message") or resp.text[:200], err.get("param"), err.get("code")
            )
        return body
