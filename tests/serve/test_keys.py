"""API keys: a request without a known key is a 401 in OpenAI's shape; a known one runs as its tenant."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from typer.testing import CliRunner

from grooves.cli import app as cli_app
from grooves.serve.keys import DEFAULT_TENANT, ApiKeys, KeyCheck, caller


def _app(keys: ApiKeys):
    async def whoami(request):
        return JSONResponse({"tenant": caller()})

    return KeyCheck(
        Starlette(routes=[Route("/who", whoami)]),
        keys=keys,
        unauthorized=lambda reason: {"error": {"message": reason, "code": "invalid_api_key"}},
    )


def _get(app, headers: dict) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://k") as c:
            return await c.get("/who", headers=headers)

    return asyncio.run(go())


def test_each_key_runs_as_its_tenant_and_others_are_refused():
    app = _app(ApiKeys({"alice": "alice-key-123", "bob": "bob-key-4567"}))
    assert _get(app, {"Authorization": "Bearer alice-key-123"}).json() == {"tenant": "alice"}
    assert _get(app, {"Authorization": "bearer bob-key-4567"}).json() == {"tenant": "bob"}
    for headers, reason in [
        ({}, "no API key was sent"),
        ({"Authorization": "Bearer alice-key-12"}, "the API key is not one of this server's"),  # a prefix
        ({"Authorization": "Basic alice-key-123"}, "the API key is not one of this server's"),
    ]:
        resp = _get(app, headers)
        assert resp.status_code == 401 and resp.headers["www-authenticate"] == "Bearer"
        assert resp.json()["error"] == {"message": reason, "code": "invalid_api_key"}
    assert caller() == DEFAULT_TENANT  # outside a request


def test_a_keys_file_is_read_and_checked(tmp_path):
    good = tmp_path / "keys.toml"
    good.write_text('[keys]\nalice = "alice-key-123"\nbob = "bob-key-4567"\n')
    assert ApiKeys.from_file(good).tenants == ["alice", "bob"]
    for text, says in [
        ('alice = "alice-key-123"\n', "expected one [keys] table"),
        ('[keys]\nalice = "short"\n', "tenant 'alice': its key must be a string of at least 8 characters"),
        ('[keys]\n"a/b" = "alice-key-123"\n', "tenant name 'a/b'"),
        ('[keys]\na = "same-key-123"\nb = "same-key-123"\n', "two tenants have the same key"),
        ("[keys\n", "not valid TOML"),
    ]:
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(ValueError, match=r"bad\.toml: ") as exc:
            ApiKeys.from_file(bad)
        assert says in str(exc.value)
    with pytest.raises(ValueError, match="no such file"):
        ApiKeys.from_file(tmp_path / "missing.toml")


def test_serve_refuses_admin_with_train_and_a_key_with_a_keys_file(tmp_path):
    keys = tmp_path / "keys.toml"
    keys.write_text('[keys]\nalice = "alice-key-123"\n')
    for options, says in [
        (["--train", "--admin"], "--admin with --train: the training service has no /v1/adapters routes"),
        (
            ["--api-key", "one-key-1234", "--api-keys", str(keys)],
            "--api-key and --api-keys: pass one of them",
        ),
    ]:
        result = CliRunner().invoke(cli_app, ["serve", "--model", str(tmp_path / "no-model"), *options])
        assert result.exit_code == 1 and says in result.output, result.output


def test_create_app_refuses_one_key_with_a_tenant_per_key_before_it_starts_a_sampler(tiny_model_dir):
    import threading

    from grooves.policy.transformers import TransformersPolicy
    from grooves.serve.app import create_app

    policy = TransformersPolicy(str(tiny_model_dir), served_name="tiny")
    samplers = lambda: [t for t in threading.enumerate() if t.name == "grooves-sampler"]  # noqa: E731
    before = len(samplers())
    with pytest.raises(
        ValueError, match=r"^give create_app api_key \(one key\) or keys \(a tenant per key\), not both$"
    ):
        create_app(policy, api_key="one-key-1234", keys=ApiKeys({"alice": "alice-key-123"}))
    assert len(samplers()) == before  # refused before a BatchScheduler thread was started
    app = create_app(policy, keys=ApiKeys({"alice": "alice-key-123"}))  # either one alone is taken
    app.state.scheduler.close()
