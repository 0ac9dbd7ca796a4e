"""An environment over HTTP: sessions that create, reset, step, snapshot, restore, grade and close.

A trainer on another machine drives episodes through this service (see `remote.py`) and takes
the grades back. Each session owns one episode and therefore one private SQLite database; the
only handle to it is an unguessable session id, so one session can never read or change
another's state. Idle sessions expire after a TTL (swept in the background and checked on every
access). Every error is a JSON body with a 4xx status, except a bug, which is a JSON 500 that
touches only the request that hit it: other sessions keep working.

Endpoints are plain `def` functions, which FastAPI runs in its thread pool; a per-session lock
serialises requests to one episode while different sessions run in parallel.

Limits: a request body is capped at `max_body_bytes` (413), counted as it streams in, so a
chunked upload cannot pass it; a restored snapshot at `max_snapshot_bytes` (413), and it must be
an intact database with exactly the seed's schema (400), since a database with views or triggers
of its own would run them here. `GET /scenarios` lists scenarios without their answers.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from grooves.asgi import BodyLimit, ServerErrors
from grooves.envs.base import SPLITS, Environment, Episode, public_scenario

MAX_BODY_BYTES = 32 * 2**20
"""Default request body cap."""
MAX_SNAPSHOT_BYTES = 16 * 2**20
"""Default cap on a restored snapshot; the built-in environments' databases are 86-156 KB."""


class SessionError(Exception):
    """A request the server refuses, with the HTTP status to refuse it with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Session:
    episode: Episode
    last_used: float
    lock: threading.Lock = field(default_factory=threading.Lock)


class SessionStore:
    """Live sessions by id, with idle expiry and a cap on how many may exist at once."""

    def __init__(self, env: Environment, *, ttl_s: float, max_sessions: int, clock: Callable[[], float]):
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0 seconds, got {ttl_s}")
        self.env, self.ttl_s, self.max_sessions, self.clock = env, ttl_s, max_sessions, clock
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def add(self, episode: Episode) -> str:
        self.sweep()
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                episode.close()
                raise SessionError(
                    429, f"{self.max_sessions} sessions are open; close some or wait for expiry"
                )
            sid = secrets.token_urlsafe(18)
            self._sessions[sid] = Session(episode, self.clock())
        return sid

    def get(self, sid: str) -> Session:
        with self._lock:
            session = self._sessions.get(sid)
            if session is not None and self.clock() - session.last_used > self.ttl_s:
                del self._sessions[sid]
                session.episode.close()
                raise SessionError(404, f"session {sid} expired after {self.ttl_s:g} s idle")
            if session is None:
                raise SessionError(404, f"no session {sid}")
            session.last_used = self.clock()
            return session

    def remove(self, sid: str) -> None:
        with self._lock:
            session = self._sessions.pop(sid, None)
        if session is None:
            raise SessionError(404, f"no session {sid}")
        with session.lock:
            session.episode.close()

    def sweep(self) -> int:
        """Close sessions idle for longer than the TTL; returns how many."""
        now = self.clock()
        with self._lock:
            stale = [sid for sid, s in self._sessions.items() if now - s.last_used > self.ttl_s]
            closed = [self._sessions.pop(sid) for sid in stale]
        for s in closed:
            with s.lock:
                s.episode.close()
        return len(closed)

    def close_all(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            s.episode.close()

    def handles(self) -> set[str]:
        """The ids of the sessions open now."""
        with self._lock:
            return set(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScenarioBody(_Body):
    scenario: dict[str, Any]


class StepBody(_Body):
    tool_call: dict[str, Any]


class GradeBody(_Body):
    messages: list[dict[str, Any]]


def create_app(
    env: Environment,
    *,
    ttl_s: float = 600.0,
    max_sessions: int = 512,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_snapshot_bytes: int = MAX_SNAPSHOT_BYTES,
    clock: Callable[[], float] = time.monotonic,
) -> FastAPI:
    """The HTTP service for one environment. `clock` is injectable so expiry can be tested."""
    store = SessionStore(env, ttl_s=ttl_s, max_sessions=max_sessions, clock=clock)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        sweeper = asyncio.create_task(_sweep_forever(store, max(0.5, min(30.0, ttl_s / 4))))
        try:
            yield
        finally:
            sweeper.cancel()
            store.close_all()

    app = FastAPI(title=f"grooves env: {env.name}", lifespan=lifespan)
    app.state.store = store
    _add_error_handling(app, max_body_bytes)
    _add_env_routes(app, env, store)
    _add_session_routes(app, env, store, max_snapshot_bytes)
    return app


def _add_env_routes(app: FastAPI, env: Environment, store: SessionStore) -> None:
    @app.get("/env")
    def describe() -> dict[str, Any]:
        return {
            "name": env.name,
            "limits": env.limits.model_dump(),
            "scenarios": {s: len(env.scenarios(s)) for s in SPLITS},
            "sessions": len(store),
        }

    @app.get("/scenarios")
    def scenarios(split: str = "train") -> list[dict[str, Any]]:
        if split not in SPLITS:
            raise SessionError(400, f"split must be one of {SPLITS}, got {split!r}")
        # without the answers: a session is opened by id, and grading reads the server's own copy
        return [public_scenario(s) for s in env.scenarios(split)]  # type: ignore[arg-type]

    @app.post("/validate")
    def validate() -> dict[str, Any]:
        report = env.validate()
        return report.model_dump() | {"ok": report.ok}


def _open(env: Environment, scenario: dict[str, Any]) -> Episode:
    try:
        return env.reset(scenario)
    except (KeyError, ValueError) as exc:
        raise SessionError(400, str(exc.args[0]) if exc.args else type(exc).__name__) from None


def _add_session_routes(app: FastAPI, env: Environment, store: SessionStore, max_snapshot_bytes: int) -> None:
    @app.post("/sessions")
    def create(body: ScenarioBody) -> dict[str, Any]:
        episode = _open(env, body.scenario)
        return {"session_id": store.add(episode), "messages": episode.messages, "tools": episode.tools}

    @app.post("/sessions/{sid}/reset")
    def reset(sid: str, body: ScenarioBody) -> dict[str, Any]:
        session = store.get(sid)
        episode = _open(env, body.scenario)
        with session.lock:
            session.episode.close()
            session.episode = episode
        return {"session_id": sid, "messages": episode.messages, "tools": episode.tools}

    @app.post("/sessions/{sid}/step")
    def step(sid: str, body: StepBody) -> dict[str, Any]:
        session = store.get(sid)
        with session.lock:
            return {"message": session.episode.step(body.tool_call), "done": session.episode.done}

    @app.get("/sessions/{sid}")
    def status(sid: str) -> dict[str, Any]:
        session = store.get(sid)
        with session.lock:
            return {"done": session.episode.done, "metrics": session.episode.metrics()}

    @app.get("/sessions/{sid}/snapshot")
    def snapshot(sid: str) -> Response:
        session = store.get(sid)
        with session.lock:
            return Response(session.episode.snapshot(), media_type="application/octet-stream")

    @app.put("/sessions/{sid}/snapshot")
    async def restore(sid: str, request: Request) -> dict[str, Any]:
        data = await request.body()
        if not data:
            raise SessionError(
                400, "the request body is empty: PUT the bytes that GET /sessions/ID/snapshot returned"
            )
        if len(data) > max_snapshot_bytes:
            raise SessionError(
                413, f"the snapshot is {len(data)} bytes; this server restores at most {max_snapshot_bytes}"
            )
        return await asyncio.to_thread(_restore, store, sid, data)

    @app.post("/sessions/{sid}/fork")
    def fork(sid: str) -> dict[str, Any]:
        session = store.get(sid)
        with session.lock:
            child = session.episode.fork()
        return {"session_id": store.add(child), "messages": child.messages, "tools": child.tools}

    @app.post("/sessions/{sid}/grade")
    def grade(sid: str, body: GradeBody) -> dict[str, Any]:
        session = store.get(sid)
        with session.lock:
            return session.episode.grade(body.messages).model_dump()

    @app.delete("/sessions/{sid}")
    def close(sid: str) -> dict[str, Any]:
        store.remove(sid)
        return {"closed": sid}


def _restore(store: SessionStore, sid: str, data: bytes) -> dict[str, Any]:
    session = store.get(sid)
    with session.lock:
        try:
            session.episode.restore(data)
        except (TypeError, ValueError) as exc:
            raise SessionError(400, str(exc)) from None
    return {"restored": sid, "bytes": len(data)}


def _add_error_handling(app: FastAPI, max_body_bytes: int) -> None:
    app.add_middleware(
        BodyLimit,
        max_bytes=max_body_bytes,
        too_large=lambda limit: {"error": "body_too_large", "detail": f"limit is {limit} bytes"},
    )
    # A bug in one episode's code answers this request only; the session, the others and the
    # client's keep-alive connection live on.
    app.add_middleware(
        ServerErrors, body=lambda exc: {"error": "internal", "detail": f"{type(exc).__name__}: {exc}"}
    )

    @app.exception_handler(SessionError)
    async def refused(request: Request, exc: SessionError) -> JSONResponse:
        return JSONResponse({"error": "refused", "detail": str(exc)}, status_code=exc.status)


async def _sweep_forever(store: SessionStore, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        await asyncio.to_thread(store.sweep)


def serve(
    env: Environment,
    *,
    host: str = "127.0.0.1",
    port: int = 8100,
    ttl_s: float = 600.0,
    max_sessions: int = 512,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_snapshot_bytes: int = MAX_SNAPSHOT_BYTES,
) -> None:
    """Run the service in the foreground (what `grooves env serve NAME` does)."""
    app = create_app(
        env,
        ttl_s=ttl_s,
        max_sessions=max_sessions,
        max_body_bytes=max_body_bytes,
        max_snapshot_bytes=max_snapshot_bytes,
    )
    ready = (
        f"environment {env.name} served at http://{host}:{port} (GET /env, GET /scenarios, POST /sessions)"
    )
    run_server(app, host=host, port=port, ready=ready, log_level="info")


def run_server(app: Any, *, host: str, port: int, ready: str, log_level: str = "warning") -> None:
    """Serve `app` with uvicorn in the foreground; `ready` is printed on stderr once the port is
    bound and requests are answered (after the app's startup), so a script can wait for that line."""
    import sys

    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(f"ready: {ready}", file=sys.stderr, flush=True)

    Server(uvicorn.Config(app, host=host, port=port, log_level=log_level)).run()
