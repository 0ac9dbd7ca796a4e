"""`grooves serve` as an operator runs it: a process on a port, driven by the real `openai` client."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from openai import NotFoundError, OpenAI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory):
    """`grooves serve --model <a folder deep in the operator's disk>`: (base URL, model folder, the log file)."""
    model = tmp_path_factory.mktemp("operator") / "private" / "models" / "tiny-llama"
    shutil.copytree(tiny_model_dir, model)
    port = free_port()
    log = tmp_path_factory.mktemp("log") / "serve.log"
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grooves", "serve", "--model", str(model), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(base_url + "/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield base_url, model, log
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_default_served_name_is_the_folders_name_and_no_error_shows_the_path(served):
    base_url, model, _ = served
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    # before: the model was served as its full path, which every 404 listed
    assert [m.id for m in client.models.list().data] == ["tiny-llama"]
    with pytest.raises(NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    message = info.value.body["message"]
    assert message == "model 'gpt-4o' is not served here; available: ['tiny-llama']"
    assert str(model.parent) not in message
    missing = httpx.get(base_url + "/models/gpt-4o").json()["error"]["message"]
    assert str(model.parent) not in missing and "tiny-llama" in missing


def test_the_request_log_line_carries_the_user(served):
    base_url, _, log = served
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    resp = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=2, user="end-user-42"
    )
    line = (
        f'chat completion model="tiny-llama" user="end-user-42" n=1 prompt_tokens={resp.usage.prompt_tokens} '
        f"completion_tokens={resp.usage.completion_tokens} finish={resp.choices[0].finish_reason}"
    )
    deadline = time.monotonic() + 10
    while line not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert line in log.read_text()  # on the server's own output, beside uvicorn's access line


def test_served_name_of_a_model_setting(tmp_path):
    from grooves.models import served_name_of

    assert served_name_of("smollm2-135m") == "smollm2-135m"
    assert served_name_of("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    folder = tmp_path / "runs" / "capitals" / "merged"
    folder.mkdir(parents=True)
    assert served_name_of(str(folder)) == "merged"
    assert served_name_of(str(folder) + "/") == "merged"
    assert served_name_of(str(folder / "..")) == "capitals"
    # the built-in model's cached folder is served by its alias
    (folder / "manifest.json").write_text(
        '{"gguf_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"}'
    )
    assert served_name_of(str(folder)) == "smollm2-135m"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"train": True, "admin": True},
            "error: --admin with --train: the training service has no /v1/adapters routes (they load any "
            "path on this machine's disk); tenants promote their own checkpoints instead",
        ),
        ({"backend": "sglang"}, "error: --backend 'sglang': use transformers or vllm"),
    ],
)
def test_serve_builds_serve_options_and_run_serve_refuses_a_contradiction_in_one_line(
    options, message, capsys
):
    """`grooves serve` is `ServeOptions` and `run_serve`: options that contradict each other end in one
    red line on stderr and exit code 1, before any model is loaded."""
    import typer

    from grooves.cli.serve import ServeOptions, run_serve

    flags = dict(
        model="no-such-model-dir",
        host="127.0.0.1",
        port=8000,
        adapter=[],
        admin=False,
        api_key=None,
        max_n=64,
        max_request_tokens=None,
        max_body_bytes=None,
        served_name=None,
        device="cpu",
        dtype="float32",
        backend="transformers",
        train=False,
        train_dir="runs/service",
        max_models=8,
        api_keys=None,
        max_step_tokens=1000,
        max_step_trajectories=10,
        max_sequence_tokens=100,
    )
    with pytest.raises(typer.Exit) as stopped:
        run_serve(ServeOptions(**(flags | options)))
    assert stopped.value.exit_code == 1
    assert " ".join(capsys.readouterr().err.split()) == message
