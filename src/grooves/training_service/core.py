"""What a training service holds and does: `Service`, behind the routes of `training_service.routes`.

The folder (`root`) holds one run folder per model, `root/<tenant>/<name>/`, and each tenant's
promotions (`root/<tenant>/promotions.json`). It is locked while a service runs (one service per
folder). A service started on a folder that holds models brings each back at its last intact
checkpoint, with its promoted adapters served again: after a kill, a loop's next step id
continues where the checkpoints left off. A model or a promotion that cannot be brought back is
named in one line and left out; the rest of the folder is served.

A step's request is read, sized (`StepLimits`) and hashed on a worker thread (`read_step`), so a
body of megabytes does not hold up every other request, `/v1/models` included.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import shutil
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from grooves.adapters.promote import Promoter
from grooves.adapters.registry import BadAdapter, check_adapter_finite
from grooves.config import ConfigError, RunConfig, check_against_model, parse_config
from grooves.models import ModelError, resolve_model
from grooves.policy.tool_format import TOOL_FORMATS
from grooves.remote.model import SERVICE_SECTIONS, service_sections
from grooves.remote.wire import TrainRequest, to_groups
from grooves.serve.errors import APIError
from grooves.serve.keys import caller
from grooves.training.checkpoint import CheckpointError, checkpoint_dir
from grooves.training.memory import auto_micro_batch_tokens
from grooves.training.old_policy import MissingVersions
from grooves.training.runlog import lock_run_dir
from grooves.training.step import NonFiniteStep
from grooves.training_service.hosted import SERVICE_FILE, HostedModel
from grooves.training_service.table import Models, ServicePolicy, ServiceTable, owned_name
from grooves.training_service.usage import Usage
from grooves.training_service.validate import SequenceBound, StepLimits, check_groups, check_size

log = logging.getLogger("grooves.training_service")

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""A trainable model's name: also a folder name, so no `/`."""
FROM_SERVICE = ("base_model", "dtype", "device", "backend", "tool_format")
"""`[model]` fields the service sets (one base for every model); a run file may repeat them, not change them."""
PROMOTIONS = "promotions.json"


class Service:
    """The models of a training service, their folder, the shared base and the usage counters."""

    def __init__(self, root: Path, base, base_policy, *, max_models: int, limits: StepLimits | None = None):
        self.root = Path(root)
        self._closing = ExitStack()
        self._closing.enter_context(lock_run_dir(self.root))  # one service per folder
        self.base, self.base_policy = base, base_policy
        self.models = Models()
        self.usage = Usage()
        self.policy = ServicePolicy(base_policy, self.models)
        self.table = ServiceTable(self.policy, self.models)
        self.promoter = Promoter(self.table)
        self.max_models = max_models
        self.limits = limits or StepLimits()
        self._creating = asyncio.Lock()

    # ---- the folder --------------------------------------------------------------------------
    def restore(self) -> None:
        """Bring back every model of the folder at its last intact checkpoint, and its promotions."""
        for meta in sorted(self.root.glob(f"*/*/{SERVICE_FILE}")):
            run_dir = meta.parent
            try:
                model = HostedModel.restore(run_dir, self.base, warn=_say)
            except (CheckpointError, ConfigError, ValueError, OSError) as exc:
                _say(f"{run_dir}: not restored: {exc}")
                continue
            self.models.add(model)
            for row in model.usage_rows():
                counts = {
                    k: int(row.get(k, 0)) for k in ("prompt_tokens", "sampled_tokens", "trained_tokens")
                }
                self.usage.add(model.tenant, model.name, **counts, steps=1)
            _say(f"restored {model.tenant}/{model.name} at step {model.step}")
        for file in sorted(self.root.glob(f"*/{PROMOTIONS}")):
            tenant = file.parent.name
            for served, entry in read_promotions(file).items():
                try:
                    self.table.add(owned_name(tenant, served), entry["path"])
                except (KeyError, TypeError, ValueError, OSError) as exc:  # a damaged entry, a folder gone
                    _say(f"{file}: {served!r} not served again: {type(exc).__name__}: {exc}")

    def close(self, *, reports: bool = True) -> None:
        """Write each model's report (as the trainer does at the end of a run), release the folder."""
        from grooves.report.write import write_report

        for model in self.models.all() if reports else []:
            if model.log.metrics_path.exists():
                try:
                    write_report(model.run_dir)
                except (OSError, ValueError) as exc:
                    _say(f"{model.run_dir}: report not written: {exc}")
        self._closing.close()

    # ---- models ------------------------------------------------------------------------------
    def model(self, tenant: str, name: str) -> HostedModel:
        model = self.models.get(tenant, name)
        if model is None:
            names = [m.name for m in self.models.of(tenant)]
            raise APIError(404, f"no trainable model {name!r}; yours: {names}", "model", "model_not_found")
        return model

    async def create(self, tenant: str, name: str, sections: dict[str, Any]) -> HostedModel:
        if not MODEL_NAME.match(name):
            raise APIError(400, f"name {name!r} must match {MODEL_NAME.pattern}", "name")
        async with self._creating:
            if self.models.get(tenant, name) is not None:
                raise APIError(
                    409, f"model {name!r} exists; connect to it or pick another name", "name", "model_exists"
                )
            if name in self.table.names() or self.table.owns(tenant, name):
                raise APIError(
                    409, f"{name!r} is already a served model name; pick another", "name", "name_taken"
                )
            if len(self.models) >= self.max_models:
                raise APIError(
                    409,
                    f"this service hosts at most {self.max_models} trainable models (--max-models)",
                    "name",
                    "max_models",
                )
            run_dir = self.root / tenant / name
            if (run_dir / SERVICE_FILE).exists():  # a model this service could not restore at its start
                raise APIError(
                    409,
                    f"model {name!r} has a run folder that the service could not restore when it started (its log "
                    "says why); the operator can move the folder away, then create the model again",
                    "name",
                    "model_exists",
                )
            config = self.run_config(sections, name, run_dir)
            if run_dir.exists():  # left by a creation that failed: it holds no model
                shutil.rmtree(run_dir)
            try:
                model = await asyncio.to_thread(HostedModel.create, tenant, name, config, self.base, run_dir)
            except BaseException:
                shutil.rmtree(run_dir, ignore_errors=True)
                raise
            self.models.add(model)
            return model

    def run_config(self, sections: dict[str, Any], name: str, run_dir: Path) -> RunConfig:
        """The model's run file: the request's sections, the service's `[model]` fields (400 naming a
        field that is not taken or that disagrees with the service)."""
        for key in sections:
            if key not in SERVICE_SECTIONS:
                raise APIError(
                    400,
                    f"config.{key}: not taken by a trainable model (it takes {', '.join(SERVICE_SECTIONS)}); "
                    "the task, validation and the watch run in your own loop",
                    f"config.{key}",
                )
        given = dict(sections.get("model") or {})
        rendering = type(self.base_policy.prompts.tool_format)  # the app renders every model's prompts
        ours = {
            "base_model": self.base.base_model,
            "dtype": self.base.dtype,
            "device": self.base.device,
            "backend": "transformers",
            "tool_format": next(k for k, v in TOOL_FORMATS.items() if v is rendering),
        }
        for field in FROM_SERVICE:
            if field in given and not self._same(field, given[field], ours[field]):
                raise APIError(
                    400,
                    f"config.model.{field}: {given[field]!r}, but this service runs {ours[field]!r} for every "
                    "model; leave it out or set it to that",
                    f"config.model.{field}",
                )
        if given.get("init_adapter") is not None:  # a path on this machine: maybe another tenant's folder
            raise APIError(
                400,
                "config.model.init_adapter: a trainable model starts from a fresh adapter; the service reads no "
                "folder a request names (create the model, then train or select its checkpoints)",
                "config.model.init_adapter",
            )
        data = {**sections, "model": {**given, **ours}}
        data.update(name=name, output_dir=str(run_dir))
        try:
            config = parse_config(data)
            check_against_model(config)
        except ConfigError as exc:
            lines = [f"config.{line}" for line in str(exc).splitlines()]
            raise APIError(400, "; ".join(lines), lines[0].split(":")[0]) from None
        self._check_memory(config)
        return config

    def _check_memory(self, config: RunConfig) -> None:
        """A model's `optim.micro_batch_tokens`, when set, within what this service's free memory holds
        (unset, the model gets that figure): a micro-batch past it would take the memory every model shares."""
        o = config.optim
        if o.micro_batch_tokens is None:
            return
        most = auto_micro_batch_tokens(
            self.base_policy.model, self.base.device, checkpointing=o.gradient_checkpointing
        )
        if o.micro_batch_tokens > most:
            raise APIError(
                400,
                f"config.optim.micro_batch_tokens: {o.micro_batch_tokens} is more than this service's free memory "
                f"holds in one micro-batch ({most} tokens now); leave it unset (the service picks {most}) or lower it",
                "config.optim.micro_batch_tokens",
            )

    @staticmethod
    def _same(field: str, given: Any, ours: Any) -> bool:
        if given == ours:
            return True
        if field != "base_model":
            return False
        try:
            return Path(resolve_model(given)).resolve() == Path(resolve_model(ours)).resolve()
        except (ModelError, OSError):
            return False

    # ---- steps -------------------------------------------------------------------------------
    def read_step(self, body: bytes) -> tuple[TrainRequest, str]:
        """A step's request from its body (blocking: run it on a worker thread), held to the
        service's limits, and the digest of its groups that tells a retry from another step."""
        try:
            req = TrainRequest.model_validate_json(body)
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None
        check_size(req.groups, self.limits)
        return req, hashlib.sha256(req.model_dump_json(include={"groups"}).encode()).hexdigest()

    def sequence_bounds(self, model: HostedModel) -> list[SequenceBound]:
        """What bounds one of `model`'s training sequences (the smallest is the bound)."""
        context, row = model.policy.prompts.max_context, model.longest_sequence
        micro = model.config.optim.micro_batch_tokens
        return [
            SequenceBound(context, f"the model's context of {context}"),
            SequenceBound(
                self.limits.max_sequence_tokens,
                f"this service's limit of {self.limits.max_sequence_tokens} per sequence (--max-sequence-tokens)",
            ),
            SequenceBound(
                row,
                f"the {row} tokens one micro-batch of this model holds in a row (optim.micro_batch_tokens = "
                f"{micro}, attention's memory per pair of positions counted); send shorter rollouts",
            ),
        ]

    async def apply(self, model: HostedModel, req: TrainRequest, digest: str) -> dict[str, Any]:
        """Apply step `req.step` once: the next step id trains, a repeat gets its first answer."""
        async with model.lock:
            if req.step <= model.step:
                earlier = model.results.get(req.step)
                if earlier is None or earlier.get("request_sha256") != digest:
                    why = "with other groups" if earlier is not None else "and is no longer on record"
                    raise APIError(
                        409,
                        f"step {req.step} was already applied {why}; this model is at step {model.step}, "
                        f"send new groups as step {model.step + 1}",
                        "step",
                        "step_conflict",
                    )
                return step_json(model, earlier, replayed=True)
            if req.step != model.step + 1:
                raise APIError(
                    409,
                    f"step {req.step}: this model is at step {model.step}; the next step id is {model.step + 1}",
                    "step",
                    "step_conflict",
                )
            await asyncio.to_thread(
                check_groups,
                req.groups,
                vocab_size=int(model.policy.model.get_input_embeddings().num_embeddings),
                sequence=self.sequence_bounds(model),
                live=model.step,
                max_staleness=model.max_staleness,
            )
            try:
                row, trained_tokens = await asyncio.to_thread(
                    lambda: model.train(to_groups(req.groups), digest)
                )
            except NonFiniteStep as exc:
                raise APIError(422, str(exc), "groups", "nonfinite_step") from None
            except MissingVersions as exc:  # raised before the step changed anything
                raise APIError(409, str(exc), "groups", "sampling_weights_gone") from None
            self.usage.add(model.tenant, model.name, trained_tokens=trained_tokens, steps=1)
            return step_json(model, row)

    def meter(self, model_name: str, prompt_tokens: int, completion_tokens: int) -> None:
        """Count an answered chat completion for the caller, and for its trainable model's next usage line."""
        tenant = caller()
        self.usage.add(tenant, model_name, prompt_tokens=prompt_tokens, sampled_tokens=completion_tokens)
        model = self.models.get(tenant, model_name)
        if model is not None:
            model.note_sampled(prompt_tokens, completion_tokens)

    # ---- checkpoints and promotion -----------------------------------------------------------
    async def select(self, model: HostedModel, step: int) -> None:
        async with model.lock:
            try:
                await asyncio.to_thread(model.select, step)
            except LookupError as exc:
                raise APIError(404, str(exc), "step", "checkpoint_not_found") from None

    async def delete_checkpoint(self, model: HostedModel, step: int) -> None:
        async with model.lock:
            kept = model.checkpoints()
            if step not in kept:
                raise APIError(404, f"model {model.name!r} has no checkpoint {step}; it has {kept}", "step")
            if step == kept[-1]:
                raise APIError(
                    409,
                    f"checkpoint {step} is the latest, which a restart of the service comes back to; "
                    "select an earlier one first",
                    "step",
                    "latest_checkpoint",
                )
            await asyncio.to_thread(shutil.rmtree, checkpoint_dir(model.run_dir, step))

    async def promote(self, model: HostedModel, step: int | None, served_name: str | None) -> dict[str, Any]:
        served = served_name or f"{model.name}-promoted"
        if not MODEL_NAME.match(served):
            raise APIError(400, f"served_name {served!r} must match {MODEL_NAME.pattern}", "served_name")
        tenant = model.tenant
        if self.models.get(tenant, served) is not None or (
            served in self.table.names() and not self.table.owns(tenant, served)
        ):
            raise APIError(409, f"{served!r} is already a served model name; pick another", "served_name")
        async with model.lock:
            kept = model.checkpoints()
            step = kept[-1] if step is None else step
            if step not in kept:
                raise APIError(404, f"model {model.name!r} has no checkpoint {step}; it has {kept}", "step")
            source = checkpoint_dir(model.run_dir, step) / "adapter"
            path = model.run_dir / "promoted" / f"step_{step:06d}"
            try:
                await asyncio.to_thread(check_adapter_finite, source)
            except BadAdapter as exc:
                raise APIError(400, str(exc), "step") from None
            if not path.exists():  # a copy: pruning checkpoints never takes a served adapter away
                await asyncio.to_thread(shutil.copytree, source, path)
            internal = owned_name(tenant, served)
            replacing = self.table.owns(tenant, served)
            if replacing:
                route = await asyncio.to_thread(self.promoter.promote, internal, str(path))
            else:
                route = await asyncio.to_thread(self.table.add, internal, str(path))
            file = self.root / tenant / PROMOTIONS
            promotions = read_promotions(file) if file.exists() else {}
            promotions[served] = {"model": model.name, "step": step, "path": str(path)}
            try:
                await asyncio.to_thread(write_atomic, file, json.dumps(promotions, indent=1))
            except OSError as exc:  # served only if a restart serves it again: undone
                undo = self.promoter.rollback if replacing else self.table.remove
                await asyncio.to_thread(undo, internal)
                raise APIError(
                    500,
                    f"the promotion was not made: {file} could not be written ({exc})",
                    "served_name",
                    "storage_error",
                    kind="server_error",
                ) from None
        return {
            "object": "served_adapter",
            "name": served,
            "model": model.name,
            "step": step,
            "adapter_id": route.adapter_id,
            "version": route.version,
        }


def model_json(model: HostedModel) -> dict[str, Any]:
    return {
        "id": model.name,
        "object": "trainable_model",
        "owned_by": model.tenant,
        "base_model": model.config.model.base_model,
        "step": model.step,
        "adapter_version": model.step,
        "config": service_sections(model.config),
        "checkpoints": model.checkpoints(),
    }


def step_json(model: HostedModel, row: dict[str, Any], *, replayed: bool = False) -> dict[str, Any]:
    return {
        "object": "train_step",
        "model": model.name,
        "step": row["step"],
        "adapter_version": row["adapter_version"],
        "metrics": row,
        "replayed": replayed,
    }


def read_promotions(file: Path) -> dict[str, Any]:
    """A tenant's promotions file: served name -> {"model", "step", "path"}; a file that cannot be
    read is named in one line and taken as empty (its tenant promotes again)."""
    try:
        promotions = json.loads(file.read_text())
        if not isinstance(promotions, dict):
            raise ValueError(f"a JSON object was expected, not {type(promotions).__name__}")
    except (OSError, ValueError) as exc:
        _say(f"{file}: promotions not read: {type(exc).__name__}: {exc}")
        return {}
    return promotions


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` whole or not at all: a temporary file beside it, flushed to disk,
    renamed over it (a write cut short by a crash or a full disk leaves the old file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
