"""An API key on every route, admin routes off unless asked, OpenAI-shaped errors for unknown routes, /health, /v1/models/{id}."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from openai import AuthenticationError, OpenAI
from typer.testing import CliRunner

from grooves.adapters.admin import mount_admin
from grooves.cli import app as cli_app
from grooves.policy.transformers import TransformersPolicy
from grooves.scale.policy_server import PolicyServer, ThreadedServer
from grooves.serve.app import create_app

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
ROUTES = [
    ("GET", "/v1/models"),
    ("GET", "/v1/models/tiny"),
    ("GET", "/health"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/adapters"),
    ("GET", "/no/such/route"),
]


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TransformersPolicy(str(tiny_model_dir), served_name="tiny")


@pytest.mark.parametrize("method,path", ROUTES)
def test_every_route_needs_the_key_when_one_is_set(policy, method, path):
    app = create_app(policy, api_key="s3cret")
    mount_admin(app)
    client = TestClient(app)
    for headers, reason in (
        ({}, "no API key was sent"),
        ({"authorization": "Bearer wrong"}, "the API key is not this server's"),
        ({"authorization": "s3cret"}, "the API key is not this server's"),
    ):
        resp = client.request(method, path, json=BODY if method == "POST" else None, headers=headers)
        assert resp.status_code == 401
        assert resp.json()["error"]["code"] == "invalid_api_key" and resp.json()["error"][
            "message"
        ].startswith(reason)
        assert resp.headers["www-authenticate"] == "Bearer"
    ok = client.request(
        method, path, json=BODY if method == "POST" else None, headers={"authorization": "Bearer s3cret"}
    )
    assert ok.status_code == (404 if path == "/no/such/route" else 200)


def test_the_openai_client_with_and_without_the_key(policy):
    with ThreadedServer(create_app(policy, api_key="s3cret")) as server:
        good = OpenAI(base_url=server.base_url + "/v1", api_key="s3cret", max_retries=0)
        assert good.chat.completions.create(**BODY).choices[0].token_ids
        with pytest.raises(AuthenticationError, match="the API key is not this server's"):
            OpenAI(base_url=server.base_url + "/v1", api_key="guess", max_retries=0).models.list()


def test_admin_routes_are_off_unless_asked(policy, tiny_model_dir, monkeypatch):
    apps = []
    monkeypatch.setattr(
        "grooves.serve.app.serve", lambda app, **kwargs: apps.append(app)
    )  # instead of blocking in uvicorn
    for flags in ([], ["--admin"]):
        assert CliRunner().invoke(cli_app, ["serve", "--model", str(tiny_model_dir), *flags]).exit_code == 0
    assert [TestClient(app).get("/v1/adapters").status_code for app in apps] == [404, 200]


def test_the_trainers_server_never_mounts_admin_routes(policy):
    with PolicyServer(policy) as server:  # the trainer's server in Ray mode
        import httpx

        resp = httpx.post(server.url + "/adapters", json={"name": "x", "path": "/etc"}, timeout=10)
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"


def test_unknown_routes_and_methods_are_openai_shaped(policy):
    client = TestClient(create_app(policy))
    missing = client.get("/v1/completions")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {
            "message": "no route GET /v1/completions; this server has /v1/models, /health, /v1/chat/completions, "
            "/v1/responses, /inference/v1/generate",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
        }
    }
    wrong = client.get("/v1/chat/completions")
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    assert wrong.json()["error"]["message"] == "GET is not allowed on /v1/chat/completions"


def test_models_by_id_and_health(policy):
    client = TestClient(create_app(policy))
    assert client.get("/v1/models/tiny").json() == {
        "id": "tiny",
        "object": "model",
        "owned_by": "grooves",
        "created": 0,
    }
    missing = client.get("/v1/models/gpt-4")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    client.post("/v1/chat/completions", json=BODY)
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["models"] == ["tiny"] and health["sampler"]["batches"] >= 1
    assert set(health["tool_calls"]) == {"parsed", "unparsed", "cut"}


def test_serve_takes_the_key_from_the_environment(monkeypatch, tiny_model_dir):
    seen = {}
    monkeypatch.setattr(
        "grooves.serve.app.serve", lambda app, **kwargs: seen.update(kwargs, app=app)
    )  # instead of uvicorn
    result = CliRunner().invoke(
        cli_app, ["serve", "--model", str(tiny_model_dir)], env={"GROOVES_API_KEY": "from-env"}
    )
    assert result.exit_code == 0, result.output
    assert seen["host"] == "127.0.0.1"
    client = TestClient(seen["app"])
    assert client.get("/health").status_code == 401
    assert client.get("/health", headers={"authorization": "Bearer from-env"}).status_code == 200
    assert (
        client.get("/v1/adapters", headers={"authorization": "Bearer from-env"}).status_code == 404
    )  # no --admin
    exposed = CliRunner().invoke(
        cli_app, ["serve", "--model", str(tiny_model_dir), "--host", "0.0.0.0"], env={"GROOVES_API_KEY": ""}
    )
    assert "warning: --host 0.0.0.0 without --api-key" in exposed.output
