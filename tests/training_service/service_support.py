"""Helpers for the training service's tests: a service app on a tiny model, a toy config, and the
in-process trainer's pieces to compare a service step with."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import httpx
import torch

from grooves.remote import TrainableModel
from grooves.training_service.app import create_service_app

TOY = {"vocab_size": 487, "num_scenarios": 8}
"""`toy_tokens` task options for the tiny model's vocabulary."""


def toy_config(model_dir, **sections) -> dict:
    """A small run file's tables: groups of 4, 2 per step, 4 tokens, one rollout at a time (so
    batches, and with them the sampled tokens, do not depend on timing)."""
    config = {
        "seed": 1,
        "model": {"base_model": str(model_dir)},
        "lora": {"rank": 4, "alpha": 8},
        "rollout": {"group_size": 4, "groups_per_step": 2, "max_tokens": 4, "concurrency": 1},
        "optim": {"lr": 5e-2},
        "logging": {"progress": False},
    }
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values} if isinstance(values, dict) else values
    return config


@contextlib.asynccontextmanager
async def service(root: Path, model_dir, *, reports: bool = False, **options):
    """(app, transport): a training service on `model_dir` keeping its models in `root`; `reports`:
    write each model's report when it closes (as `grooves serve --train` does; slow)."""
    app = create_service_app(root, str(model_dir), **options)
    try:
        yield app, httpx.ASGITransport(app=app)
    finally:
        app.state.scheduler.close()
        app.state.service.close(reports=reports)


async def create(
    transport, name: str, config: dict, *, api_key: str | None = None, **options
) -> TrainableModel:
    return await TrainableModel.create(
        "http://svc", name, config, api_key=api_key, transport=transport, **options
    )


def http(transport, api_key: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(transport=transport, base_url="http://svc", headers=headers)


def adapter(policy) -> dict[str, torch.Tensor]:
    """A copy of a policy's trainable (LoRA) weights."""
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}


def hosted(app, name: str, tenant: str = "default"):
    return app.state.service.models.get(tenant, name)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
