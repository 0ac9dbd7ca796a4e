"""An ASGI app on a real port, served by uvicorn from a background thread.

Rollouts in other processes (Ray actors, here or on other machines) reach the policy the way any
agent would: an `openai` client pointed at this URL. The trainer keeps running in the main
thread; uvicorn's event loop runs in its own thread, and sampling runs on the app's batching
thread, so requests from every worker are batched together as they are in process. Tests and
benchmarks use the same class to put an app on a loopback port.
"""

from __future__ import annotations

import socket
import threading
import time

from grooves.serve.app import create_app


class ThreadedServer:
    """`ThreadedServer(app)` listens at once on `base_url`; `close()` (or leaving `with`) stops it."""

    def __init__(
        self,
        app,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
        timeout_s: float = 30.0,
    ):
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))  # port 0: the system picks a free one, known before the server starts
        self._sock = sock
        self.port = sock.getsockname()[1]
        self.base_url = f"http://{advertise or host}:{self.port}"
        config = uvicorn.Config(app, log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="grooves-http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {host}:{self.port} within {timeout_s:.0f} s")
            time.sleep(0.02)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> ThreadedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PolicyServer(ThreadedServer):
    """A policy's OpenAI-compatible app; `url` is the base URL for an `openai` client."""

    def __init__(
        self,
        policy,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertise: str | None = None,
        timeout_s: float = 30.0,
        api_key: str | None = None,
    ):
        # no admin routes: the trainer's server samples, and nothing may change what it runs from outside
        self.app = create_app(policy, api_key=api_key)
        super().__init__(self.app, host=host, port=port, advertise=advertise, timeout_s=timeout_s)
        self.url = self.base_url + "/v1"

    def close(self) -> None:
        super().close()
        # the app is this server's own: its sampler thread must not outlive it (see BatchScheduler.close);
        # an app handed to ThreadedServer stays its owner's to close
        self.app.state.scheduler.close()
