"""Any MCP tool server as an environment: `McpEnvironment`, on the official `mcp` SDK's client.

The server supplies the tools: its tool list, converted to the OpenAI `tools` format, is what the
model sees, and every tool call the model makes goes to the server through the MCP client. The
task supplies the rest: scenarios (dicts with `id`, `split` and `prompt`, and whatever its grader
reads, such as `expected`), a grader, and optionally a system prompt and a gold solver that
`validate()` plays to prove the grader. So `run_episode`, `make_rollout` and `EnvironmentTask`
train on an MCP server like on a built-in environment.

Isolation: each episode opens its own MCP connection by default (`per_episode=True`): over stdio
that starts its own server process, over Streamable HTTP it is a new MCP session, so a stateful
server never mixes two rollouts' state. `per_episode=False` shares one connection, for servers
whose tools keep no state. A grooves environment served with `grooves env serve NAME --mcp` is
opened with `McpEnvironment.from_env_server`: scenarios, episodes and grades then come from the
server's `grooves_*` control tools (see `envs.mcp_server`), episodes share one connection, and each
request names its episode in `_meta`.

The `Environment` contract is synchronous (the rollout loop runs it in worker threads) and the
MCP client is async, so the client lives on an event loop in a background thread of its own and
each call waits for its result there. A tool call that fails (an MCP error result, a timeout, a
dropped connection) becomes a tool message with the error, as a built-in tool's failure does; the
episode goes on. Snapshots and forks are not offered: MCP has no way to copy a server's state.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from grooves.envs.base import (
    SPLITS,
    Grade,
    Limits,
    Scenario,
    Split,
    ValidationReport,
    as_messages,
    callable_name,
    final_answer,
    parse_tool_call,
    tool_calls_made,
)
from grooves.envs.mcp_server import CONTROL_PREFIX, EPISODE_META_KEY
from grooves.envs.tools import error_content, parse_arguments


class McpError(RuntimeError):
    """The MCP server could not be reached or refused a request the environment needs (not a tool call)."""


@dataclass(frozen=True)
class McpServer:
    """How to reach an MCP server: a command to run over stdio, or a Streamable HTTP URL."""

    command: tuple[str, ...] = ()
    url: str | None = None
    env: dict[str, str] | None = None
    """Environment variables for a stdio server process (None: this process's)."""

    @classmethod
    def parse(cls, spec: str | Sequence[str]) -> McpServer:
        """`http(s)://...` is a URL; anything else a command line (a string is split like a shell).

        >>> McpServer.parse("python -m notes_server --db x.sqlite").command
        ('python', '-m', 'notes_server', '--db', 'x.sqlite')
        >>> McpServer.parse("http://127.0.0.1:8100/mcp").url
        'http://127.0.0.1:8100/mcp'
        """
        if isinstance(spec, str) and spec.startswith(("http://", "https://")):
            return cls(url=spec)
        command = tuple(shlex.split(spec)) if isinstance(spec, str) else tuple(spec)
        if not command:
            raise ValueError("an MCP server needs a command or an http(s) URL")
        return cls(command=command)

    def client(self, timeout_s: float):
        # mode="legacy": the initialize handshake, which gives a Streamable HTTP connection its own
        # MCP session (per-episode isolation); the 2026 protocol has no sessions, and servers of
        # both eras accept the handshake
        from mcp import Client, StdioServerParameters

        if self.url:
            return Client(self.url, read_timeout_seconds=timeout_s, mode="legacy")
        params = StdioServerParameters(command=self.command[0], args=list(self.command[1:]), env=self.env)
        return Client(params, read_timeout_seconds=timeout_s, mode="legacy")


class _Loop:
    """An asyncio loop in a daemon thread; `run` submits a coroutine and waits for its result."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="grooves-mcp")
        self.thread.start()

    def run(self, coro, timeout_s: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)


class _Connection:
    """One MCP client connection, entered and exited by one task (as anyio requires) while other
    tasks call through it."""

    def __init__(self, server: McpServer, loop: _Loop, timeout_s: float):
        self.server, self.loop, self.timeout_s = server, loop, timeout_s
        self._client = None
        self._closed: asyncio.Event | None = None
        self._task: asyncio.Future | None = None

    def open(self) -> _Connection:
        async def hold(started: asyncio.Future) -> None:
            self._closed = asyncio.Event()
            try:
                async with self.server.client(self.timeout_s) as client:
                    self._client = client
                    started.set_result(None)
                    await self._closed.wait()
            except BaseException as exc:  # a failed start is reported to `open`; a later failure ends it
                if not started.done():
                    started.set_exception(exc)
                    return
                raise

        async def start() -> None:
            started = asyncio.get_running_loop().create_future()
            self._task = asyncio.ensure_future(hold(started))
            await started

        try:
            self.loop.run(start(), self.timeout_s + 30)
        except Exception as exc:
            where = self.server.url or " ".join(self.server.command)
            raise McpError(
                f"MCP server {where} could not be started or reached: {type(exc).__name__}: {exc}"
            ) from exc
        return self

    def list_tools(self) -> list[Any]:
        async def go():
            return (await self._client.list_tools()).tools

        return self.loop.run(go(), self.timeout_s + 5)

    def call_tool(self, name: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None):
        async def go():
            return await self._client.call_tool(name, arguments, meta=meta)

        return self.loop.run(go(), self.timeout_s + 5)

    def close(self) -> None:
        if self._closed is None or self._task is None:
            return
        closed, task = self._closed, self._task

        async def stop() -> None:
            closed.set()
            try:
                await asyncio.wait_for(task, 10)
            except Exception:  # the server went away first: nothing left to close
                pass

        try:
            self.loop.run(stop(), 15)
        except Exception:
            pass
        self._closed = None


def result_text(result: Any) -> str:
    """An MCP tool result as the text of a tool message: its text blocks joined, else its
    structured content as JSON; other blocks (images, audio) are named, not inlined."""
    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        parts.append(block.text if kind == "text" else f"[{kind} content]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


def openai_tools(tools: Sequence[Any], allow: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """MCP tools as OpenAI `tools` (the server's control tools left out; `allow` keeps only those named)."""
    out = []
    for tool in tools:
        if tool.name.startswith(CONTROL_PREFIX) or (allow is not None and tool.name not in allow):
            continue
        params = tool.input_schema or {"type": "object", "properties": {}}
        out.append(
            {
                "type": "function",
                "function": {"name": tool.name, "description": tool.description or "", "parameters": params},
            }
        )
    return out


@dataclass(frozen=True)
class McpGradeInput:
    """What a task's grader sees: the scenario, the chat, the final answer, the calls made, and
    `call(name, arguments) -> text` to ask the episode's server about its end state."""

    scenario: Scenario
    messages: list[dict[str, Any]]
    answer: str
    calls: list[tuple[str, dict[str, Any]]]
    call: Callable[[str, dict[str, Any]], str]


Grader = Callable[[McpGradeInput], Grade | float]
Solver = Callable[[Scenario, Callable[[str, dict[str, Any]], Any]], str]


@dataclass
class McpEnvironment:
    """An `Environment` whose tools come from an MCP server; scenarios and grader from the task."""

    server: McpServer
    name: str = "mcp"
    scenarios_by_split: dict[str, list[Scenario]] = field(default_factory=dict)
    grade: Grader | None = None
    system_prompt: str = ""
    limits: Limits = field(default_factory=Limits)
    tools: Sequence[str] | None = None
    """Only these of the server's tools are offered to the model (None: all)."""
    per_episode: bool = True
    timeout_s: float = 30.0
    """Seconds one MCP request may take; a tool call past it is a tool error."""
    gold: Solver | None = None
    env_server: bool = False
    """The server is `grooves env serve NAME --mcp`: scenarios, episodes and grades are its own."""

    def __post_init__(self) -> None:
        if not self.env_server and self.grade is None:
            raise ValueError("McpEnvironment needs a grader: grade=fn(McpGradeInput) -> Grade or float")
        for split, items in self.scenarios_by_split.items():
            if split not in SPLITS:
                raise ValueError(f"scenarios: split must be one of {SPLITS}, got {split!r}")
            for s in items:
                if not isinstance(s, dict) or "id" not in s or "prompt" not in s:
                    raise ValueError(
                        f"scenarios[{split!r}]: each scenario needs an 'id' and a 'prompt', got {s!r}"
                    )
        self._loop = _Loop()
        self._shared: _Connection | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_env_server(cls, server: McpServer | str, **options) -> McpEnvironment:
        """A grooves environment served over MCP (`grooves env serve NAME --mcp [--stdio]`)."""
        server = McpServer.parse(server) if isinstance(server, str) else server
        env = cls(server, env_server=True, per_episode=False, **options)
        if env.name == "mcp":
            env.name = "mcp:" + (server.url or " ".join(server.command))
        return env

    def _shared_connection(self) -> _Connection:
        with self._lock:
            if self._shared is None:
                self._shared = _Connection(self.server, self._loop, self.timeout_s).open()
            return self._shared

    def _control(self, name: str, arguments: dict[str, Any], handle: str | None = None) -> dict[str, Any]:
        conn = self._shared_connection()
        result = conn.call_tool(name, arguments, {EPISODE_META_KEY: handle} if handle else None)
        text = result_text(result)
        if result.is_error:
            raise McpError(f"{name}: {text}")
        return result.structured_content or json.loads(text)

    def scenarios(self, split: Split) -> list[Scenario]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if self.env_server:
            return list(self._control("grooves_scenarios", {"split": split})["scenarios"])
        return [dict(s) for s in self.scenarios_by_split.get(split, [])]

    def reset(self, scenario: Scenario) -> McpEpisode:
        if not isinstance(scenario, dict) or "id" not in scenario:
            raise ValueError("reset needs a scenario dict with an 'id' (from env.scenarios(split))")
        if self.env_server:
            body = self._control("grooves_reset", {"scenario_id": str(scenario["id"]), "bind": False})
            conn = self._shared_connection()
            tools = openai_tools(conn.list_tools(), self.tools)
            return McpEpisode(
                self, scenario, conn, tools, list(body["messages"]), handle=body["episode"], owns=False
            )
        trusted = next(
            (
                dict(s)
                for items in self.scenarios_by_split.values()
                for s in items
                if s["id"] == scenario["id"]
            ),
            None,
        )
        if trusted is None:
            raise KeyError(f"{self.name} has no scenario {scenario['id']!r}")
        conn = (
            _Connection(self.server, self._loop, self.timeout_s).open()
            if self.per_episode
            else self._shared_connection()
        )
        try:
            tools = openai_tools(conn.list_tools(), self.tools)
        except BaseException:
            if self.per_episode:
                conn.close()
            raise
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else []) + [
            {"role": "user", "content": trusted["prompt"]}
        ]
        return McpEpisode(self, trusted, conn, tools, messages, handle=None, owns=self.per_episode)

    def validate(self, splits: Sequence[Split] = SPLITS, bad_threshold: float = 0.5) -> ValidationReport:
        """The gold solver (when given) must score 1.0 on every scenario; an empty answer with no tool
        calls must score at most `bad_threshold`."""
        from grooves.envs.sqlite import play

        gold_scores, bad_scores, failures = [], [], []
        scenarios = [s for split in splits for s in self.scenarios(split)]
        for sc in scenarios:
            solvers = [("gold", self.gold)] if self.gold is not None else []
            for kind, solver in [*solvers, ("bad", lambda scenario, call: "")]:
                episode = self.reset(sc)
                try:
                    grade = episode.grade(play(episode, solver, sc))
                finally:
                    episode.close()
                if kind == "gold":
                    gold_scores.append(grade.score)
                    if grade.score < 1.0:
                        failures.append(
                            f"{sc['id']}: gold scored {grade.score:.3f} ({'; '.join(grade.notes)})"
                        )
                else:
                    bad_scores.append(grade.score)
                    if grade.score > bad_threshold:
                        failures.append(f"{sc['id']}: an empty answer scored {grade.score:.3f}")
        if self.gold is None:
            failures.append("no gold solver: pass gold= to prove that the grader can give 1.0")
        return ValidationReport(
            env=self.name,
            scenarios=len(scenarios),
            gold_scores=gold_scores,
            bad_scores=bad_scores,
            bad_threshold=bad_threshold,
            failures=failures,
            gold_solver=callable_name(self.gold, "gold"),
            bad_solvers={"empty answer": bad_scores},
        )

    def close(self) -> None:
        if self._shared is not None:
            self._shared.close()
            self._shared = None
        self._loop.stop()


class McpEpisode:
    """One rollout's session on the MCP server: its opening messages, tools and counters."""

    def __init__(
        self,
        env: McpEnvironment,
        scenario: Scenario,
        conn: _Connection,
        tools: list[dict[str, Any]],
        messages: list[dict[str, Any]],
        *,
        handle: str | None,
        owns: bool,
    ):
        self.env, self.scenario, self.conn = env, scenario, conn
        self._tools, self._messages = tools, messages
        self.handle, self.owns = handle, owns
        self.counters = {"tool_calls": 0.0, "tool_errors": 0.0, "elapsed_s": 0.0}
        self._closed = False

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self._messages)

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self._tools

    @property
    def done(self) -> bool:
        budget = self.env.limits.latency_budget_s
        return budget is not None and self.counters["elapsed_s"] >= budget

    def _meta(self) -> dict[str, Any] | None:
        return {EPISODE_META_KEY: self.handle} if self.handle else None

    def _call_text(self, name: str, arguments: dict[str, Any]) -> tuple[str, str | None]:
        """(text, error kind or None) of one tool call; never raises."""
        started = time.perf_counter()
        try:
            result = self.conn.call_tool(name, arguments, self._meta())
        except Exception as exc:  # a timeout or a dropped connection is a failed call, not a lost rollout
            return error_content("mcp_error", f"{type(exc).__name__}: {exc}"), "mcp_error"
        finally:
            self.counters["elapsed_s"] += time.perf_counter() - started
        text = result_text(result)
        return (error_content("tool_error", text), "tool_error") if result.is_error else (text, None)

    def step(self, tool_call: Any) -> dict[str, Any]:
        limits = self.env.limits
        try:
            call = parse_tool_call(tool_call)
        except TypeError as exc:
            return self._reply("", error_content("invalid_tool_call", str(exc)), "invalid_tool_call")
        if self.done:
            text = f"latency budget of {limits.latency_budget_s} s is spent; give your final answer now"
            return self._reply(call.id, error_content("budget_exhausted", text), "budget_exhausted")
        if call.name not in {t["function"]["name"] for t in self._tools}:
            names = ", ".join(t["function"]["name"] for t in self._tools)
            return self._reply(
                call.id,
                error_content("unknown_tool", f"no tool {call.name!r}; tools: {names}"),
                "unknown_tool",
            )
        if len(call.arguments) > limits.max_argument_chars:
            text = f"arguments are {len(call.arguments)} characters; at most {limits.max_argument_chars}"
            return self._reply(call.id, error_content("arguments_too_long", text), "arguments_too_long")
        arguments, problem = parse_arguments(call.arguments)
        if problem is not None:
            return self._reply(call.id, error_content(*problem), problem[0])
        text, error = self._call_text(call.name, arguments)
        return self._reply(call.id, text[: limits.max_result_chars], error)

    def _reply(self, call_id: str, content: str, error: str | None) -> dict[str, Any]:
        self.counters["tool_calls"] += 1
        if error is not None:
            self.counters["tool_errors"] += 1
        return {"role": "tool", "tool_call_id": call_id, "content": content}

    def grade(self, trajectory: Any) -> Grade:
        messages = as_messages(trajectory)
        if self.env.env_server:
            return Grade.model_validate(
                self.env._control("grooves_grade", {"messages": messages}, self.handle)
            )

        def ask(name: str, arguments: dict[str, Any]) -> str:
            return self._call_text(name, arguments)[0]

        inputs = McpGradeInput(
            self.scenario, messages, final_answer(messages), tool_calls_made(messages), ask
        )
        graded = self.env.grade(inputs)  # type: ignore[misc]
        return graded if isinstance(graded, Grade) else Grade(score=min(1.0, max(0.0, float(graded))))

    def snapshot(self) -> bytes:
        raise NotImplementedError(
            "an MCP server's state cannot be snapshotted; use a built-in environment for that"
        )

    def restore(self, data: bytes) -> None:
        raise NotImplementedError(
            "an MCP server's state cannot be restored; use a built-in environment for that"
        )

    def fork(self) -> McpEpisode:
        raise NotImplementedError(
            "an MCP server's state cannot be forked; use a built-in environment for that"
        )

    def metrics(self) -> dict[str, float]:
        out = dict(self.counters)
        if self.env.env_server and not self._closed:
            server = self.env._control("grooves_metrics", {}, self.handle)["metrics"]
            out.update({f"server_{k}": float(v) for k, v in server.items()})
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.env.env_server:
            try:
                self.env._control("grooves_close", {}, self.handle)
            except McpError:  # already expired on the server
                pass
        elif self.owns:
            self.conn.close()
