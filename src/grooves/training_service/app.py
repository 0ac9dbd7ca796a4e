"""The training service's app: `grooves serve --train`, the policy server with trainable models.

One process holds one base model (`policy.shared_base`) and, per trainable model, what the trainer
holds for a run (`training_service.hosted`). Its HTTP app is `serve.create_app`'s (the same chat
completions, limits and errors) with the training routes added (`training_service.routes`), API keys as
tenants (`serve.keys`), and an adapter table that shows each tenant only its own models
(`training_service.table`). `training_service.core.Service` holds the models and their folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fastapi import FastAPI

from grooves.config import ModelConfig
from grooves.policy import policy_for, shared_base
from grooves.serve.app import MAX_BODY_BYTES, MAX_REQUEST_TOKENS, create_app
from grooves.serve.keys import ApiKeys
from grooves.training_service.core import Service
from grooves.training_service.routes import service_router
from grooves.training_service.tinker.routes import tinker_router
from grooves.training_service.tinker.server import TinkerService
from grooves.training_service.validate import StepLimits


def create_service_app(
    root: str | Path,
    base_model: str,
    *,
    keys: ApiKeys | None = None,
    served_name: str | None = None,
    adapters: Sequence[tuple[str, str]] = (),
    dtype: str = "float32",
    device: str = "cpu",
    max_models: int = 8,
    max_n: int = 64,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_request_tokens: int | None = MAX_REQUEST_TOKENS,
    limits: StepLimits | None = None,
) -> FastAPI:
    """The training service's app over `base_model`, its models kept under `root` (restored from it).

    `adapters` (name, path) are served beside the base to every tenant, as `grooves serve
    --adapter NAME=PATH` serves them. `limits` bound one training step (default `StepLimits()`). `app.state.service` is the `Service`; close it (and
    `app.state.scheduler`) when the app's owner ends.
    """
    base = shared_base(base_model, dtype=dtype, device=device)
    model_config = ModelConfig(base_model=base_model, dtype=dtype, device=device)
    base_policy = policy_for(model_config, None, seed=0, served_name=served_name or base_model, base=base)
    service = Service(Path(root), base, base_policy, max_models=max_models, limits=limits)
    for name, path in adapters:
        service.table.add(name, path)
    service.restore()
    app = create_app(
        service.policy,
        max_n=max_n,
        adapters=service.table,
        max_body_bytes=max_body_bytes,
        max_request_tokens=max_request_tokens,
        keys=keys,
        meter=service.meter,
    )
    app.state.service = service
    app.include_router(service_router(service))
    app.state.tinker = TinkerService(service, max_n=max_n, max_request_tokens=max_request_tokens)
    app.include_router(tinker_router(app.state.tinker))
    return app
