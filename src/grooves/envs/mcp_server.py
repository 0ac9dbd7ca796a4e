"""An environment as an MCP server (`grooves env serve NAME --mcp`), on the official `mcp` SDK.

Any MCP client (an agent framework, an MCP inspector, `envs.mcp.McpEnvironment`) can then run the
environment's episodes. The server lists the environment's tools, plus five control tools whose
names start with `grooves_`:

    grooves_scenarios(split)      the split's scenarios, without their answers
    grooves_reset(scenario_id)    open an episode for a scenario: its opening messages and its handle
    grooves_grade(messages)       grade the episode's chat against the server's own copy of the answers
    grooves_metrics()             the episode's counters (tool calls, errors, simulated seconds)
    grooves_close()               close the episode now (else it expires after the TTL)

One episode per MCP session: `grooves_reset` binds the new episode to the session that asked for
it (the Streamable HTTP session id; on stdio the process serves one client), and the environment's
tools and the other control tools then act on that episode. The 2026 protocol has no sessions, so
a client may instead name an episode in each request's `_meta` under `grooves/episode`, with the
handle `grooves_reset` returned; `McpEnvironment` always does, so several episodes can share one
connection.

The isolation is the HTTP environment server's (`envs/server.py`), whose `SessionStore` holds the
episodes here too: each episode owns its own SQLite database; its only handle is an unguessable
id (the episode handle, or the session id the SDK issues, also unguessable); idle episodes close
after the TTL; at most `max_sessions` are open (a reset beyond that is refused); one episode's
requests are serialised by its lock while different episodes run in parallel; answers never leave
the server (`public_scenario`). A bad tool call is a tool result the agent reads; a control call
that cannot be served (no episode, unknown scenario) is an MCP tool error (`isError`), never a
crash. Requests larger than `max_body_bytes` are refused by the SDK (413) before parsing.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server

from grooves.envs.base import SPLITS, Environment, public_scenario
from grooves.envs.server import SessionError, SessionStore

EPISODE_META_KEY = "grooves/episode"
"""`_meta` key naming the episode a request acts on (the handle `grooves_reset` returns)."""
CONTROL_PREFIX = "grooves_"

_CONTROL_TOOLS = [
    types.Tool(
        name="grooves_scenarios",
        description="The environment's scenarios of a split (train or validation), without their answers.",
        input_schema={
            "type": "object",
            "properties": {"split": {"type": "string", "enum": list(SPLITS)}},
            "additionalProperties": False,
        },
    ),
    types.Tool(
        name="grooves_reset",
        description="Open a new episode for a scenario (closing this session's previous one); returns its opening messages and its handle.",
        input_schema={
            "type": "object",
            "properties": {
                "scenario_id": {"type": "string"},
                "bind": {
                    "type": "boolean",
                    "description": "bind it to this MCP session (default); false: reach it only by its handle",
                },
            },
            "required": ["scenario_id"],
            "additionalProperties": False,
        },
    ),
    types.Tool(
        name="grooves_grade",
        description="Grade the episode's chat (OpenAI-style messages) against the scenario's answers.",
        input_schema={
            "type": "object",
            "properties": {"messages": {"type": "array", "items": {"type": "object"}}},
            "required": ["messages"],
            "additionalProperties": False,
        },
    ),
    types.Tool(
        name="grooves_metrics",
        description="The episode's counters.",
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
    ),
    types.Tool(
        name="grooves_close",
        description="Close the episode.",
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
    ),
]


def env_tools(env: Environment) -> list[dict[str, Any]]:
    """The environment's tools in OpenAI format: its toolbox's, or a probe episode's."""
    toolbox = getattr(env, "toolbox", None)
    if toolbox is not None:
        return list(toolbox.specs)
    first = (env.scenarios("train") or env.scenarios("validation"))[0]
    episode = env.reset(first)
    try:
        return list(episode.tools)
    finally:
        episode.close()


def _result(body: Any, *, error: bool = False) -> types.CallToolResult:
    text = body if isinstance(body, str) else json.dumps(body)
    structured = body if isinstance(body, dict) else None
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=structured, is_error=error
    )


class EpisodeRouter:
    """Which episode a request acts on: the `_meta` handle, else its MCP session's bound episode."""

    def __init__(self, env: Environment, store: SessionStore):
        self.env, self.store = env, store
        self.bound: dict[str, str] = {}
        """MCP session id (or "stdio") -> the episode handle grooves_reset opened for it."""
        self._lock = threading.Lock()  # handlers run in worker threads

    def binding_key(self, ctx: Any) -> str:
        request = getattr(ctx, "request", None)
        headers = getattr(request, "headers", None)
        session_id = headers.get("mcp-session-id") if headers is not None else None
        return f"session:{session_id}" if session_id else "stdio"

    def handle(self, ctx: Any, arguments: dict[str, Any] | None = None) -> str:
        meta = ctx.meta or {}
        handle = meta.get(EPISODE_META_KEY) if isinstance(meta, dict) else None
        if handle:
            return str(handle)
        with self._lock:
            handle = self.bound.get(self.binding_key(ctx))
        if handle is None:
            raise SessionError(404, "no episode in this session: call grooves_reset(scenario_id) first")
        return handle

    def reset(self, ctx: Any, scenario_id: str, bind: bool = True) -> dict[str, Any]:
        scenarios = {str(s["id"]): s for split in SPLITS for s in self.env.scenarios(split)}  # type: ignore[arg-type]
        if scenario_id not in scenarios:
            raise SessionError(400, f"no scenario {scenario_id!r} in {self.env.name}")
        episode = self.env.reset(scenarios[scenario_id])
        handle = self.store.add(episode)
        if not bind:  # reached by its handle alone (several episodes on one connection)
            return {
                "episode": handle,
                "messages": episode.messages,
                "scenario": public_scenario(scenarios[scenario_id]),
            }
        key = self.binding_key(ctx)
        with self._lock:
            previous = self.bound.get(key)
            self.bound[key] = handle
            # sessions whose episode expired or was closed keep no entry here
            live = self.store.handles()
            self.bound = {k: v for k, v in self.bound.items() if v in live}
        if previous is not None:
            try:
                self.store.remove(previous)
            except SessionError:  # already expired
                pass
        return {
            "episode": handle,
            "messages": episode.messages,
            "scenario": public_scenario(scenarios[scenario_id]),
        }

    def close(self, ctx: Any) -> dict[str, Any]:
        handle = self.handle(ctx)
        self.store.remove(handle)
        with self._lock:
            self.bound = {k: v for k, v in self.bound.items() if v != handle}
        return {"closed": handle}


def build_server(
    env: Environment,
    *,
    ttl_s: float = 600.0,
    max_sessions: int = 512,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Server, SessionStore]:
    """The MCP server of one environment and the store of its open episodes."""
    store = SessionStore(env, ttl_s=ttl_s, max_sessions=max_sessions, clock=clock)
    router = EpisodeRouter(env, store)
    tools = env_tools(env)
    listed = [
        types.Tool(
            name=t["function"]["name"],
            description=t["function"].get("description", ""),
            input_schema=t["function"].get("parameters") or {"type": "object"},
        )
        for t in tools
    ]
    names = {t.name for t in listed}

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[*listed, *_CONTROL_TOOLS])

    def call(ctx, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        if name == "grooves_scenarios":
            split = arguments.get("split", "train")
            if split not in SPLITS:
                raise SessionError(400, f"split must be one of {SPLITS}, got {split!r}")
            return _result({"scenarios": [public_scenario(s) for s in env.scenarios(split)]})
        if name == "grooves_reset":
            return _result(
                router.reset(ctx, str(arguments.get("scenario_id", "")), bool(arguments.get("bind", True)))
            )
        if name == "grooves_close":
            return _result(router.close(ctx))
        session = store.get(router.handle(ctx))
        with session.lock:
            episode = session.episode
            if name == "grooves_grade":
                return _result(episode.grade(list(arguments.get("messages") or [])).model_dump())
            if name == "grooves_metrics":
                return _result({"done": episode.done, "metrics": episode.metrics()})
            raw = {
                "id": "mcp",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            reply = episode.step(raw)  # a bad call is a tool message the agent reads, never an exception
            return _result(reply["content"], error=_is_tool_error(reply["content"]))

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        name, arguments = params.name, dict(params.arguments or {})
        if name not in names and not name.startswith(CONTROL_PREFIX):
            return _result(f"unknown tool {name!r}; tools: {', '.join(sorted(names))}", error=True)
        try:
            return await anyio.to_thread.run_sync(call, ctx, name, arguments)
        except SessionError as exc:
            return _result({"error": "refused", "status": exc.status, "detail": str(exc)}, error=True)
        except (KeyError, ValueError, TypeError) as exc:
            return _result({"error": "refused", "detail": f"{type(exc).__name__}: {exc}"}, error=True)

    server = Server(
        f"grooves-env-{env.name}",
        instructions=(
            f"grooves environment {env.name}: call grooves_reset(scenario_id) to open an episode "
            "(grooves_scenarios lists them), then the tools; grooves_grade scores the chat."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    return server, store


def _is_tool_error(content: str) -> bool:
    """The environment's tool errors are JSON objects with an `error` kind (`envs.tools.error_content`)."""
    try:
        body = json.loads(content)
    except (json.JSONDecodeError, TypeError):
        return False
    return isinstance(body, dict) and "error" in body and "message" in body


async def _sweep(store: SessionStore, every_s: float) -> None:
    while True:
        await anyio.sleep(every_s)
        await anyio.to_thread.run_sync(store.sweep)


def serve_stdio(env: Environment, *, ttl_s: float = 600.0, max_sessions: int = 512) -> None:
    """Serve the environment over stdin/stdout until the client closes the pipe."""
    from mcp.server.stdio import stdio_server

    server, store = build_server(env, ttl_s=ttl_s, max_sessions=max_sessions)

    async def main() -> None:
        async with stdio_server() as (read, write), anyio.create_task_group() as tg:
            tg.start_soon(_sweep, store, max(0.5, min(30.0, ttl_s / 4)))
            try:
                await server.run(read, write, server.create_initialization_options())
            finally:
                tg.cancel_scope.cancel()
                store.close_all()

    anyio.run(main)


def serve_http(
    env: Environment,
    *,
    host: str = "127.0.0.1",
    port: int = 8100,
    ttl_s: float = 600.0,
    max_sessions: int = 512,
    max_body_bytes: int = 32 * 2**20,
) -> None:
    """Serve the environment over Streamable HTTP at http://HOST:PORT/mcp (foreground); prints
    `ready: MCP server for NAME at URL` on stderr once it answers."""
    import contextlib

    from grooves.envs.server import run_server

    server, store = build_server(env, ttl_s=ttl_s, max_sessions=max_sessions)
    app = server.streamable_http_app(
        host=host,
        session_idle_timeout=ttl_s,
        max_sessions=max_sessions,
        max_request_body_size=max_body_bytes,
    )
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a):
        async with inner(a), anyio.create_task_group() as tg:
            tg.start_soon(_sweep, store, max(0.5, min(30.0, ttl_s / 4)))
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
                store.close_all()

    app.router.lifespan_context = lifespan
    run_server(app, host=host, port=port, ready=f"MCP server for {env.name} at http://{host}:{port}/mcp")
