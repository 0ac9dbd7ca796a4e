"""`grooves export --push-to-hub REPO`: the files and model card it uploads, and the upload itself
against a fake Hub on loopback (HF_ENDPOINT), which records what arrives."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time

import pytest
import uvicorn
from adapters_support import make_run
from fastapi import FastAPI, Request
from typer.testing import CliRunner

from grooves.adapters.export import export_adapter
from grooves.adapters.hub import hub_files, model_card
from grooves.cli import app as cli_app
from grooves.models import describe_base, record_adapter_base

CONFIG = 'name = "capitals"\nsteps = 3\n[optim]\nlr = 0.0002\n'


class FakeHub:
    """Enough of the Hub's API for create_repo and create_commit: every file is a regular
    (non-LFS) upload, so the commit carries the files' bytes, which are kept here."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []
        self.created: list[dict] = []
        self.files: dict[str, bytes] = {}
        self.token_seen: set[str] = set()
        app = FastAPI()

        @app.middleware("http")
        async def record(request: Request, call_next):
            self.calls.append((request.method, request.url.path))
            self.token_seen.add(request.headers.get("authorization", ""))
            return await call_next(request)

        @app.post("/api/repos/create")
        async def create(request: Request):
            body = await request.json()
            self.created.append(body)
            return {"url": f"{self.url}/{body['organization']}/{body['name']}"}

        @app.post("/api/validate-yaml")
        async def validate_yaml():
            return {"errors": [], "warnings": []}

        @app.post("/api/models/{org}/{name}/preupload/{revision}")
        async def preupload(org: str, name: str, revision: str, request: Request):
            files = (await request.json())["files"]
            return {
                "files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
            }

        @app.post("/api/models/{org}/{name}/commit/{revision}")
        async def commit(org: str, name: str, revision: str, request: Request):
            for line in (await request.body()).decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    self.files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            return {"commitUrl": f"{self.url}/{org}/{name}/commit/abc123", "commitOid": "abc123"}

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(5)


@pytest.fixture
def exported_run(tiny_model_dir, tmp_path):
    """A run folder whose best checkpoint records its base (with a Hub id) and config, exported."""
    run = make_run(tmp_path / "run", {1: 0.25, 2: 0.75, 3: None}, model_dir=tiny_model_dir)
    for step in (1, 2, 3):
        checkpoint = run / "checkpoints" / f"step_{step:06d}"
        (checkpoint / "config.toml").write_text(CONFIG)
        base = describe_base(str(tiny_model_dir))
        record_adapter_base(
            checkpoint / "adapter", base.__class__("acme/tiny-llama", base.path, base.weights_sha256)
        )
    out = tmp_path / "out"
    export_adapter(run / "checkpoints" / "step_000002" / "adapter", out, gguf_type="f32")
    return run, out


def test_the_upload_lays_out_a_model_repo_with_a_model_card(exported_run, tiny_model_dir):
    run, out = exported_run
    listed = [dest for _, dest in hub_files(out)]
    merged = sorted(p.name for p in (out / "merged").iterdir())
    assert listed == [
        *merged,
        *[f"adapter/{p.name}" for p in sorted((out / "adapter").iterdir())],
        "model.gguf",
        "export.json",
    ]
    assert (
        "config.json" in listed and "model.safetensors" in listed and "adapter/adapter_config.json" in listed
    )

    card = model_card(out, "acme/capitals-rl")
    header = card.split("---")[1]
    assert (
        "base_model: acme/tiny-llama" in header
        and "library_name: transformers" in header
        and "- gguf" in header
    )
    assert (
        "| 1 | 0.25 |" in card and "| 2 | 0.75 |" in card
    )  # validation figures of the run, per validated step
    assert "the checkpoint of step 2" in card
    assert CONFIG.strip() in card  # the run's resolved config, as saved with the checkpoint
    sha = describe_base(str(tiny_model_dir)).weights_sha256
    assert f"`{sha}`" in card and "max |logit(gguf) - logit(merged)|" in card


def test_push_to_hub_uploads_every_file_to_the_endpoint(exported_run, monkeypatch):
    run, out = exported_run
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        result = CliRunner().invoke(
            cli_app,
            [
                "export",
                str(run),
                "--select",
                "best",
                "--out",
                str(out),
                "--overwrite",
                "--format",
                "gguf",
                "--gguf-type",
                "f32",
                "--push-to-hub",
                "acme/capitals-rl",
                "--private",
            ],
        )
    assert result.exit_code == 0, result.output
    assert f"pushed to acme/capitals-rl: {hub.url}/acme/capitals-rl/commit/abc123" in result.output
    assert hub.created == [{"name": "capitals-rl", "organization": "acme", "visibility": "private"}]
    assert "Bearer hf_test_token" in hub.token_seen
    expected = {dest: src.read_bytes() for src, dest in hub_files(out)}
    assert "README.md" in expected and hub.files == expected  # every file, byte for byte, in one commit
    assert [c for c in hub.calls if c[1].endswith("/commit/main")] == [
        ("POST", "/api/models/acme/capitals-rl/commit/main")
    ]


def test_a_refused_push_is_one_line_and_keeps_the_export(exported_run, monkeypatch):
    run, out = exported_run
    with FakeHub() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        result = CliRunner().invoke(
            cli_app,
            [
                "export",
                str(run / "checkpoints" / "step_000001"),
                "--out",
                str(out),
                "--overwrite",
                "--push-to-hub",
                "not a repo id",
            ],
        )
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "--push-to-hub not a repo id:" in result.output and f"the export is in {out}" in result.output
    assert (out / "merged" / "config.json").is_file()
