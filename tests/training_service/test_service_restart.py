"""`grooves serve --train` as a process: killed with SIGKILL and started again, its models come back at
their last checkpoint and a loop's next step continues exactly; a step whose connection is cut after
the service applied it is answered, not applied again, when the client retries it; stopped with
SIGTERM, it writes each model's report as it does on Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
from safetensors.torch import load_file
from service_support import TOY, create, rows, service, toy_config

from grooves.remote import TrainableModel
from grooves.remote.wire import to_records
from grooves.tasks.toy import ToyTokensTask

TASK = ToyTokensTask(**TOY)
SCENARIOS = TASK.scenarios("train")[:2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(model_dir, root, port: int, log) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "grooves.cli", "serve", "--train", "--model", str(model_dir)]
    cmd += ["--train-dir", str(root), "--port", str(port)]
    proc = subprocess.Popen(
        cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT
    )
    deadline = time.time() + 240
    while True:
        assert proc.poll() is None, f"the service exited with {proc.returncode}"
        assert time.time() < deadline, "the service did not start in 240 s"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.3)


def _send_and_hang_up(port: int, body: bytes, applied) -> None:
    """POST a step over a raw connection, wait until the service has applied it, then close the
    connection without reading the answer (a client that died, a proxy that dropped it)."""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        head = (
            f"POST /v1/trainable_models/toy/steps HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        conn.sendall(head.encode() + body)
        deadline = time.time() + 120
        while not applied():
            assert time.time() < deadline
            time.sleep(0.05)


def test_a_killed_service_comes_back_at_its_last_checkpoint_and_continues_exactly(tiny_model_dir, tmp_path):
    root, port = tmp_path / "svc", _free_port()
    base = f"http://127.0.0.1:{port}"
    config = toy_config(tiny_model_dir)
    log = (tmp_path / "service.log").open("w")
    run_dir = root / "default" / "toy"

    async def before_kill():
        model = await TrainableModel.create(base, "toy", config)
        for _ in range(2):
            await model.train(await model.gather(TASK.rollout, SCENARIOS))
        await model.promote(2, "toy-live")
        await model.close()

    async def after_restart():
        model = await TrainableModel.connect(base, "toy")
        assert (model.step, model.adapter_version) == (2, 2)
        assert (await model.train(await model.gather(TASK.rollout, SCENARIOS))).step == 3
        groups = await model.gather(TASK.rollout, SCENARIOS)
        body = json.dumps({"step": 4, "groups": to_records(groups)}).encode()
        applied = lambda: 4 in [r["step"] for r in rows(run_dir / "metrics.jsonl")]  # noqa: E731
        await asyncio.to_thread(_send_and_hang_up, port, body, applied)
        retried = await model.train(groups)  # the same step id: answered, not applied again
        assert (retried.step, retried.replayed) == (4, True)
        served = await model.openai_client().chat.completions.create(
            model="toy-live", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert served.choices[0].model_extra["adapter_id"] is not None  # the promotion came back too
        await model.close()

    proc = _start(tiny_model_dir, root, port, log)
    try:
        asyncio.run(before_kill())
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc = _start(tiny_model_dir, root, port, log)
        asyncio.run(after_restart())
    finally:
        proc.send_signal(signal.SIGINT)  # a graceful stop writes each model's report
        proc.wait(timeout=120)
    assert (run_dir / "report.html").is_file()
    assert "restored default/toy at step 2" in (tmp_path / "service.log").read_text()

    async def uninterrupted():  # the same four steps in a service that was never killed
        async with service(tmp_path / "ref", tiny_model_dir) as (_, transport):
            model = await create(transport, "toy", config)
            for _ in range(4):
                await model.train(await model.gather(TASK.rollout, SCENARIOS))
            await model.close()

    asyncio.run(uninterrupted())
    ref_dir = tmp_path / "ref" / "default" / "toy"
    got, want = rows(run_dir / "metrics.jsonl"), rows(ref_dir / "metrics.jsonl")
    assert [r["step"] for r in got] == [1, 2, 3, 4]  # the killed service's steps, each once

    def same(r):  # the digest covers each rollout's measured seconds, a trajectory metric
        return {k: v for k, v in r.items() if k not in ("seconds_train", "request_sha256")}

    assert [same(r) for r in got] == [same(r) for r in want]
    adapter = "checkpoints/step_000004/adapter/adapter_model.safetensors"
    a, b = load_file(str(run_dir / adapter)), load_file(str(ref_dir / adapter))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert [r["step"] for r in rows(run_dir / "usage.jsonl")] == [1, 2, 3, 4]


def test_sigterm_stops_the_service_after_writing_each_models_report(tiny_model_dir, tmp_path):
    root, port = tmp_path / "svc", _free_port()

    async def one_step():
        model = await TrainableModel.create(f"http://127.0.0.1:{port}", "toy", toy_config(tiny_model_dir))
        await model.train(await model.gather(TASK.rollout, SCENARIOS))
        await model.close()

    with (tmp_path / "service.log").open("w") as log:
        proc = _start(tiny_model_dir, root, port, log)
        try:
            asyncio.run(one_step())
        finally:
            proc.send_signal(signal.SIGTERM)  # what systemd, docker stop and kubernetes send
            code = proc.wait(timeout=120)
    assert code == 128 + signal.SIGTERM  # an exit, not a death by the signal (-15)
    assert (root / "default" / "toy" / "report.html").is_file()
