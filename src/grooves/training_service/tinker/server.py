"""What a training service holds for Tinker clients: sessions, training models, saved weights.

`TinkerService` sits beside `service.core.Service` (the same base model, tenants, folder and
limits) and keeps:

- sessions (`create_session`), each a tenant's, numbering the training models it creates: model
  `n` of session `s` is `s:train:n`, the id the SDK also derives itself;
- training models (`training.TinkerModel`), counted with the service's trainable models against
  `--max-models`, each with the `SeqOrder` its requests run in; a session's models are freed
  when the session finishes (the SDK's `ServiceClient.close`);
- saved weights, on disk under `<train dir>/<tenant>/tinker/<model>/`: `weights/<name>/` (a
  state: adapter, optimizer, RNG, LoRA settings) and `sampler_weights/<name>/` (an adapter), named
  by `tinker://<model_id>/weights/<name>` and `tinker://<model_id>/sampler_weights/<name>`. They
  outlive the models and the process: a service restarted on the same folder loads them.

A path or id of another tenant does not exist for a caller (404 or a failed future saying so).
"""

from __future__ import annotations

import asyncio
import contextvars
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from grooves.models import resolve_model
from grooves.serve.errors import APIError
from grooves.training_service.core import Service
from grooves.training_service.hosted import HostedModel
from grooves.training_service.table import owned_name
from grooves.training_service.tinker.futures import Futures, RequestFailed, SeqOrder
from grooves.training_service.tinker.sampling import Samplers
from grooves.training_service.tinker.training import LoraSettings, TinkerModel, folder_name, read_settings

KINDS = {"weights": "training", "sampler_weights": "sampler"}
EPHEMERAL = "ephemeral-"
KEEP_EPHEMERAL = 8
"""Unnamed sampler weights (`save_weights_and_get_sampling_client()`) a model keeps on disk."""


@dataclass
class Session:
    session_id: str
    tenant: str
    models: list[str] = field(default_factory=list)


class TinkerService:
    """The Tinker side of a training service (see the module docstring)."""

    def __init__(self, service: Service, *, max_n: int, max_request_tokens: int | None):
        self.service = service
        self.max_n, self.max_request_tokens = max_n, max_request_tokens
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, TinkerModel] = {}
        self.orders: dict[str, SeqOrder] = {}
        self.futures = Futures()
        self.samplers = Samplers(self)
        self._creating = asyncio.Lock()
        self.workers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="tinker")
        """Where the models' work runs (blocking torch work, most of it waiting for the base's lock):
        apart from the event loop's default threads, which read and check the next requests."""

    async def run(self, work):
        """`work()` on the model workers, in the caller's context (its tenant)."""
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self.workers, context.run, work)

    # ---- what the samplers use -------------------------------------------------------------
    @property
    def base_policy(self):
        return self.service.base_policy

    @property
    def policy(self):
        return self.service.policy

    @property
    def table(self):
        return self.service.table

    def load_owned(self, tenant: str, name: str, folder: Path) -> None:
        self.service.table.add(owned_name(tenant, name), str(folder))

    def unload_owned(self, tenant: str, name: str) -> None:
        if self.service.table.owns(tenant, name):
            self.service.table.remove(owned_name(tenant, name))

    # ---- the base model ------------------------------------------------------------------------
    @property
    def base_name(self) -> str:
        return self.service.base_policy.served_name

    @property
    def tokenizer_path(self) -> str:
        """A folder the SDK's `get_tokenizer` loads the tokenizer from, with no download."""
        return str(Path(resolve_model(self.service.base.base_model)).resolve())

    def check_base(self, name: str | None) -> str:
        if (
            name is None
            or name == self.base_name
            or Service._same("base_model", name, self.service.base.base_model)
        ):
            return name or self.base_name
        raise APIError(
            400,
            f"base_model {name!r}: this server trains and samples {self.base_name!r} (also accepted: the path "
            f"{self.tokenizer_path})",
            "base_model",
            "model_not_found",
        )

    # ---- sessions and models -----------------------------------------------------------------
    def create_session(self, tenant: str) -> Session:
        session = Session(uuid.uuid4().hex[:16], tenant)
        self.sessions[session.session_id] = session
        return session

    def session(self, tenant: str, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None or session.tenant != tenant:
            raise APIError(
                404, f"no session {session_id!r}; create one first", "session_id", "session_not_found"
            )
        return session

    def finish(self, tenant: str, session_id: str) -> None:
        """The session's client closed: its training models are freed (their saved weights stay)."""
        session = self.session(tenant, session_id)
        for model_id in session.models:
            self.models.pop(model_id, None)
            self.orders.pop(model_id, None)
        session.models.clear()

    def model(self, tenant: str, model_id: str) -> TinkerModel:
        model = self.models.get(model_id)
        if model is None or model.tenant != tenant:
            raise APIError(
                404,
                f"no training model {model_id!r} (a model lives as long as its session; after a restart, create "
                "one from a saved state)",
                "model_id",
                "model_not_found",
            )
        return model

    async def create_model(
        self, tenant: str, session_id: str, model_seq_id: int, settings: LoraSettings
    ) -> TinkerModel:
        """A new training model `<session>:train:<model_seq_id>` with a fresh adapter (blocking work on a thread)."""
        session = self.session(tenant, session_id)
        model_id = f"{session_id}:train:{model_seq_id}"
        async with self._creating:
            if model_id in self.models:
                raise APIError(
                    400,
                    f"model {model_id!r} exists: model_seq_id {model_seq_id} was already used",
                    "model_seq_id",
                )
            hosted_count = len(self.service.models) + len(self.models)
            if hosted_count >= self.service.max_models:
                raise APIError(
                    400,
                    f"this service hosts at most {self.service.max_models} models (--max-models); close a "
                    "ServiceClient (its models are freed) or restart the service with a higher --max-models",
                    "base_model",
                    "max_models",
                )
            name = folder_name(model_id)
            folder = self.folder(tenant, model_id)
            config = self.service.run_config(settings.sections(), name, folder)
            hosted = await self.run(
                lambda: HostedModel.build(tenant, name, config, self.service.base, folder)
            )
            model = TinkerModel(model_id, tenant, settings, hosted, folder)
            self.models[model_id] = model
            self.orders[model_id] = SeqOrder()
            session.models.append(model_id)
            return model

    # ---- saved weights -----------------------------------------------------------------------
    def folder(self, tenant: str, model_id: str) -> Path:
        return self.service.root / tenant / "tinker" / folder_name(model_id)

    def path_of(self, model_id: str, kind: str, name: str) -> str:
        return f"tinker://{model_id}/{kind}/{name}"

    def resolve(self, tenant: str, path: str, kind: str | None = None) -> tuple[str, str, str, Path]:
        """(model id, kind, name, folder) of a `tinker://` path of the caller's (RequestFailed otherwise)."""
        parts = path.removeprefix("tinker://").split("/") if path.startswith("tinker://") else []
        if len(parts) != 3 or parts[1] not in KINDS:
            raise RequestFailed(
                f"{path!r} is not a weights path: tinker://<model_id>/weights/<name> or .../sampler_weights/<name>"
            )
        model_id, found, name = parts
        if kind is not None and found != kind:
            how = "save_weights_for_sampler" if kind == "sampler_weights" else "save_state"
            raise RequestFailed(f"{path!r} holds {KINDS[found]} weights; this needs weights saved with {how}")
        try:
            folder = self.folder(tenant, model_id) / found / folder_name(name)
        except ValueError as exc:
            raise RequestFailed(f"{path!r}: {exc}") from None
        if not folder.is_dir():
            raise RequestFailed(f"no saved weights at {path!r}")
        return model_id, found, name, folder

    def new_weights_folder(self, model: TinkerModel, kind: str, name: str, *, overwrite: bool = True) -> Path:
        try:
            folder = model.folder / kind / folder_name(name)
        except ValueError as exc:
            raise RequestFailed(f"path {name!r}: {exc}") from None
        if folder.exists() and not overwrite:
            raise RequestFailed(
                f"{self.path_of(model.model_id, kind, name)} exists; save under another name or pass overwrite=True"
            )
        folder.parent.mkdir(parents=True, exist_ok=True)
        return folder

    def prune_ephemeral(self, model: TinkerModel) -> None:
        """Keep the model's newest `KEEP_EPHEMERAL` unnamed sampler weights on disk."""
        folder = model.folder / "sampler_weights"
        found = sorted(
            (p for p in folder.glob(f"{EPHEMERAL}*") if p.name.removeprefix(EPHEMERAL).isdigit()),
            key=lambda p: int(p.name.removeprefix(EPHEMERAL)),
        )
        for old in found[:-KEEP_EPHEMERAL]:
            self.unload_owned(model.tenant, f"tinker/{model.folder.name}/{old.name}")
            shutil.rmtree(old, ignore_errors=True)

    def checkpoints(self, tenant: str, model_id: str) -> list[dict]:
        """The saved weights of `model_id` (a live model's or one of an earlier session's), oldest first."""
        root = self.folder(tenant, model_id)
        out = []
        for kind, label in KINDS.items():
            for folder in sorted((root / kind).glob("*")) if (root / kind).is_dir() else []:
                if not folder.is_dir() or folder.name.endswith(".tmp"):
                    continue
                size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
                out.append(
                    {
                        "checkpoint_id": f"{kind}/{folder.name}",
                        "checkpoint_type": label,
                        "time": datetime.fromtimestamp(folder.stat().st_mtime, UTC).isoformat(),
                        "tinker_path": self.path_of(model_id, kind, folder.name),
                        "size_bytes": size,
                        "public": False,
                    }
                )
        return sorted(out, key=lambda c: c["time"])

    def delete_checkpoint(self, tenant: str, model_id: str, checkpoint_id: str) -> None:
        kind, _, name = checkpoint_id.partition("/")
        try:
            folder = self.folder(tenant, model_id) / kind / folder_name(name)
        except ValueError:
            folder = None
        if kind not in KINDS or folder is None or not folder.is_dir():
            raise APIError(
                404, f"training run {model_id!r} has no checkpoint {checkpoint_id!r}", "checkpoint_id"
            )
        self.unload_owned(tenant, f"tinker/{folder.parent.parent.name}/{folder.name}")
        shutil.rmtree(folder)

    def settings_of(self, folder: Path) -> LoraSettings:
        try:
            return read_settings(folder)
        except (OSError, ValueError, TypeError) as exc:
            raise RequestFailed(
                f"the saved state {folder.name!r} has no readable LoRA settings: {exc}"
            ) from None
