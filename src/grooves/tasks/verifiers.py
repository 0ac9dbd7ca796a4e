"""A verifiers environment as a grooves task: `task = "verifiers:<taskset id>"` in a run file.

verifiers (PyPI `verifiers`, 0.4) cannot share grooves' virtualenv (it pins `openai < 3` and
`mcp == 2.0.0`), so its environment server runs in one of its own (`make setup-verifiers`:
`.venv-verifiers`, from constraints/verifiers.txt) and grooves drives it over its wire protocol:
a ZeroMQ DEALER socket, requests of three frames (request id, method, msgpack payload), answers
of three (request id, `delta` or `reply`, msgpack payload). Nothing is installed at run time:
the environment's package must already be installed in that virtualenv.

- Start (on first use): `verifiers_server.py` runs in that virtualenv. It checks the verifiers
  version, loads the taskset's rows for training and validation, and serves the environment on
  a local port. An unknown environment id or a version outside the supported range stops the
  run before anything else, in one line naming it.
- A rollout is one `run` request: the task's row, the served model's name, the run's sampling
  settings, and a client config of type `train` pointing at grooves' own server. verifiers then
  runs its agent harness (by default `null`, a plain chat program, in a local `subprocess`
  runtime), which samples every turn through grooves' `POST /inference/v1/generate` with the
  prompt ids verifiers rendered itself; the traces come back as deltas
  (`verifiers_traces.TraceAssembly`) and become one trajectory with each turn's exact ids and
  logprobs (`verifiers_traces.trajectory_of`). A trace without token ids is refused, not
  re-tokenized.
- The trainer's model is served in process (no port); verifiers' server is another process, so
  the app behind the rollout's client is put on a local port once (`LocalPort`).
- Each turn records the adapter version that sampled it (`served_version`): the version behind the
  model name the rollout asks for on the trainer's in-process server (a pinned `<name>@v<N>` when
  rollouts run ahead of the trainer, else the live adapter's, which must not change during the
  episode), the version grooves' token route reports for each sample. A policy served elsewhere
  does not say; its turns record none, and a run that needs every turn's version (truncated
  importance sampling of stale turns) refuses them.

Options: `taskset` (the taskset's settings beside its id), `validation_taskset` (the settings of
the held-out rows), `agent` (verifiers' agent settings: harness and runtime), each a dict or, in a
run file, a JSON object in a string (`validation_taskset = '{"split": "test"}'`); `holdout`,
`python` (verifiers' interpreter), `success_threshold`, `renderer_model`.

Splits: `train` is the taskset's rows with `taskset` settings; `validation` is the rows of
`validation_taskset` when given, else the last `holdout` fraction of the training rows (held
out of `train`); `test` is empty.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import math
import os
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from grooves.core.trajectory import Trajectory
from grooves.rollouts.handle import ModelHandle
from grooves.tasks.verifiers_traces import TraceAssembly, TraceError, trajectory_of

DEFAULT_PYTHON = ".venv-verifiers/bin/python"
"""verifiers' virtualenv, relative to the working directory (`make setup-verifiers` builds it)."""
SERVER_SCRIPT = Path(__file__).with_name("verifiers_server.py")
START_TIMEOUT_S = 180.0
DEFAULT_AGENT = {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}
"""verifiers' plain chat harness in a local subprocess: offline, no tools of its own, no cloud sandbox."""


class VerifiersError(ValueError):
    """verifiers' environment server could not be started or refused a rollout (a `ValueError`, so a
    task that cannot start is reported as a task that cannot be built, in one line)."""


class VerifiersTask:
    """`verifiers:<env>` (see the module docstring for the options' meaning)."""

    def __init__(
        self,
        env: str,
        taskset: dict[str, Any] | str | None = None,
        validation_taskset: dict[str, Any] | str | None = None,
        holdout: float = 0.25,
        agent: dict[str, Any] | str | None = None,
        python: str | None = None,
        success_threshold: float = 1.0,
        renderer_model: str | None = None,
    ):
        if not 0 <= holdout < 1:
            raise ValueError(f"holdout must be in [0, 1), got {holdout}")
        self.env, self.name = env, f"verifiers:{env}"
        missing = [
            pkg
            for module, pkg in (("zmq", "pyzmq"), ("msgpack", "msgpack"))
            if not importlib.util.find_spec(module)
        ]
        if missing:
            raise VerifiersError(
                f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: "
                "pip install 'grooves[verifiers]' (make setup installs it)"
            )
        self.python = Path(python or os.environ.get("GROOVES_VERIFIERS_PYTHON") or DEFAULT_PYTHON)
        if not self.python.exists():
            raise ValueError(
                f"verifiers' Python {self.python} does not exist: build its virtualenv with make setup-verifiers, "
                "or give task_options.python"
            )
        taskset, agent = _object("taskset", taskset), _object("agent", agent)
        self.config = {"taskset": {"id": env, **(taskset or {})}, "agent": agent or DEFAULT_AGENT}
        self.validation_taskset = _object("validation_taskset", validation_taskset)
        self.holdout = holdout
        self.success_threshold, self.renderer_model = success_threshold, renderer_model
        self._server: subprocess.Popen | None = None
        self._rows: dict[str, list[dict[str, Any]]] = {}
        self._port: LocalPort | None = None
        self._lock = threading.Lock()
        self.address = ""
        self.start()  # fail at load time, in one line: an unknown env, a verifiers version out of range

    # ---- the environment server ---------------------------------------------------------------
    def start(self) -> None:
        splits: dict[str, Any] = {"train": {}} | (
            {"validation": self.validation_taskset} if self.validation_taskset else {}
        )
        self.address = f"tcp://127.0.0.1:{_free_port()}"
        rows_file = Path(tempfile.mkdtemp(prefix="grooves-vf-")) / "rows.json"
        bin_dir = str(self.python.parent)
        # its own `uv` first on the PATH (the harness runs its chat program with it); none of grooves' Python
        # settings: `-I` keeps this file's folder (which holds a `verifiers.py`) off its import path
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
        cmd = [
            str(self.python),
            "-I",
            str(SERVER_SCRIPT),
            "--config",
            json.dumps(self.config),
            "--splits",
            json.dumps(splits),
        ]
        self.log = rows_file.with_name("server.log")
        """verifiers' server's output (a file, not a pipe: a pipe nobody reads would stall it once full)."""
        with open(self.log, "w") as log:
            self._server = subprocess.Popen(
                [*cmd, "--rows", str(rows_file), "--address", self.address],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        atexit.register(self.close)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not rows_file.exists():
            if self._server.poll() is not None:
                lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
                errors = [ln for ln in lines if ln.startswith("error: ")]
                raise VerifiersError(
                    (errors[-1][len("error: ") :] if errors else lines[-1] if lines else "exited")
                    + f" (task verifiers:{self.env})"
                )
            if time.monotonic() > deadline:
                self.close()
                raise VerifiersError(
                    f"verifiers environment {self.env!r} did not load in {START_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.1)
        time.sleep(0.2)  # the file is written whole before the server binds; its health check below waits
        rows = json.loads(rows_file.read_text())["rows"]
        train = rows["train"]
        if "validation" in rows:
            self._rows = {"train": train, "validation": rows["validation"]}
        else:
            cut = len(train) - math.ceil(len(train) * self.holdout)
            self._rows = {"train": train[:cut], "validation": train[cut:]}
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        """Blocks until the server answers `health` (a plain socket: the caller may be inside an event loop)."""
        import msgpack
        import zmq

        sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline:
                sock.send_multipart([uuid.uuid4().hex.encode(), b"health", msgpack.packb({})])
                if sock.poll(2000):
                    _, _, data = sock.recv_multipart()
                    if msgpack.unpackb(data, raw=False).get("success"):
                        return
                if self._server is not None and self._server.poll() is not None:
                    tail = " ".join(self.log.read_text(errors="replace").strip().splitlines()[-1:])
                    raise VerifiersError(f"verifiers' environment server exited ({self.log}): {tail}")
        finally:
            sock.close()
        raise VerifiersError(
            f"verifiers' environment server at {self.address} did not answer in {START_TIMEOUT_S:.0f} s"
        )

    def close(self) -> None:
        if self._server is not None and self._server.poll() is None:
            try:
                os.killpg(self._server.pid, 15)
                self._server.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if self._port is not None:
            self._port.close()

    async def _call(self, method: str, payload: dict[str, Any], on_delta=None) -> dict[str, Any]:
        """One request on its own DEALER socket: the deltas it streams go to `on_delta`, then its reply."""
        import msgpack
        import zmq
        import zmq.asyncio

        ctx = zmq.asyncio.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        request_id = uuid.uuid4().hex.encode()
        try:
            await sock.send_multipart(
                [request_id, method.encode(), msgpack.packb(payload, use_bin_type=True)]
            )
            while True:
                rid, kind, data = await sock.recv_multipart()
                message = msgpack.unpackb(data, raw=False, strict_map_key=False)
                if rid != request_id:
                    continue
                if kind == b"delta":
                    if on_delta is not None:
                        on_delta(message)
                    continue
                return message
        finally:
            sock.close()

    # ---- the Task protocol --------------------------------------------------------------------
    def scenarios(self, split: str) -> list[dict[str, Any]]:
        rows = self._rows.get(split, [])
        return [
            {"id": f"{self.env}-{row.get('idx', i)}", "split": split, "task_data": row}
            for i, row in enumerate(rows)
        ]

    async def rollout(self, model: ModelHandle, scenario: dict[str, Any]) -> Trajectory:
        base_url, renderer = self._endpoint(model)
        version = served_version(model)
        client = {
            "type": "train",
            "base_url": base_url,
            "api_key_var": "GROOVES_VERIFIERS_KEY",
            "renderer_model_name": renderer,
        }
        sampling = {"temperature": model.temperature, "top_p": model.top_p, "max_tokens": model.max_tokens}
        request = {
            "task_data": scenario["task_data"],
            "client": client,
            "model": model.name,
            "sampling": sampling,
        }
        assembly = TraceAssembly()
        reply = await self._call("run", request, on_delta=assembly.apply)
        if not reply.get("success"):
            raise VerifiersError(f"verifiers' environment server refused the rollout: {reply.get('error')}")
        head = reply.get("head") or {}
        if head.get("errors"):
            last = head["errors"][-1]
            raise VerifiersError(f"the episode failed: {last.get('type')}: {last.get('message')}")
        traces = assembly.finish(reply.get("traces") or [])
        trainable = [t for t in traces if (t.get("agent") or {}).get("trainable", True)]
        if len(trainable) != 1:
            raise TraceError(
                f"the episode has {len(trainable)} trainable traces; grooves trains single-agent episodes"
            )
        after = served_version(model)
        if after != version:
            raise VerifiersError(
                f"the model {model.name!r} changed from adapter version {version} to {after} during the episode, "
                "so which version sampled each turn is unknown"
            )
        traj = trajectory_of(
            trainable[0],
            temperature=model.temperature,
            success_threshold=self.success_threshold,
            adapter_version=version,
        )
        traj.metadata.update(
            {"env": self.name, "scenario_id": scenario.get("id"), "split": scenario.get("split")}
        )
        return traj

    def _endpoint(self, model: ModelHandle) -> tuple[str, str]:
        """(the URL verifiers' server reaches grooves at, the model directory its renderer loads)."""
        app = _inprocess_app(model)
        if app is None:  # a client of a server with a port already
            if self.renderer_model is None:
                raise VerifiersError(
                    "task_options.renderer_model: the model directory verifiers' renderer loads is needed when the "
                    "policy is served elsewhere"
                )
            return str(model.client.base_url).rstrip("/"), self.renderer_model
        with self._lock:
            if self._port is None:
                self._port = LocalPort(app)
        renderer = self.renderer_model or app.state.policy.tokenizer.name_or_path
        return f"{self._port.base_url}/v1", renderer


def _inprocess_app(model: ModelHandle) -> Any:
    """The ASGI app behind `model.client` when the policy is served in this process, else None."""
    http = getattr(model.client, "_client", None)
    return getattr(getattr(http, "_transport", None), "app", None)


def served_version(model: ModelHandle) -> int | None:
    """The adapter version that samples for `model.name` on the in-process server, the one its token
    route reports with each sample: a pinned version's (`<name>@v<N>`, rollouts ahead of the trainer)
    or the live adapter's; None for a policy served elsewhere."""
    app = _inprocess_app(model)
    if app is None:
        return None
    routes = app.state.adapters
    return routes.version_of(routes.get(model.name))


class LocalPort:
    """An ASGI app (the trainer's in-process server) on a loopback port, in a thread of its own."""

    def __init__(self, app):
        import uvicorn

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise VerifiersError("the trainer's server did not start on a local port")
            time.sleep(0.02)

    def close(self) -> None:
        self._server.should_exit = True


def _object(name: str, value: dict[str, Any] | str | None) -> dict[str, Any] | None:
    """An option that is a table of verifiers settings: a dict, or (in a run file, whose task options
    are scalars) a JSON object in a string."""
    if value is None or isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ValueError(
            f'{name} must be a JSON object of verifiers settings, like \'{{"split": "test"}}\'; got {value!r}'
        )
    return parsed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
