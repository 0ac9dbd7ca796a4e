"""MCP both ways, on loopback with real server processes and the official SDK's client:
an MCP tool server supplies an environment's tools (`McpEnvironment`), and a built-in environment
is served as an MCP server (`grooves env serve NAME --mcp`), one episode per MCP session."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_envs_rollout import ScriptedClient

from grooves.envs import get_env, make_rollout, run_episode
from grooves.envs.mcp import McpEnvironment, McpError, McpServer
from grooves.envs.sqlite import play
from grooves.rollouts.gather import gather

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}  # the server processes import what this one does
sys.path.insert(0, str(ROOT / "examples"))

from mcp_notes.task import make_env  # noqa: E402

NOTES_SERVER = McpServer(
    command=(sys.executable, str(ROOT / "examples" / "mcp_notes" / "server.py")), env=ENV
)
GROOVES = (sys.executable, "-m", "grooves.cli")


def test_an_mcp_servers_tools_are_the_models_tools_and_the_task_grades(tmp_path):
    env = make_env(NOTES_SERVER)
    try:
        scenario = env.scenarios("train")[0]
        assert scenario["prompt"] == "Save a note that says: buy milk"

        def agent(messages):  # one bad call of each kind, then the right one, then the answer
            turn = sum(m["role"] == "assistant" for m in messages)
            script = [
                ("", [("no_such_tool", {})]),
                ("", [("add_note", "{not json")]),
                ("", [("add_note", {"text": ""})]),  # the server's own error
                ("", [("add_note", {"text": "buy milk"})]),
                ("Saved.", []),
            ]
            return script[turn]

        client = ScriptedClient(agent)
        traj = asyncio.run(run_episode(client, env, scenario, model="m", max_turns=6))
        tools = {t["function"]["name"]: t["function"] for t in client.requests[0]["tools"]}
        assert sorted(tools) == ["add", "add_note", "list_notes"]  # the server's list, as OpenAI tools
        assert tools["add_note"]["description"] == "Save a note."
        assert tools["add_note"]["parameters"]["required"] == ["text"]
        replies = [m["content"] for m in traj.messages if m["role"] == "tool"]
        assert json.loads(replies[0])["error"] == "unknown_tool"
        assert json.loads(replies[1])["error"] == "invalid_json"
        assert json.loads(replies[2]) == {
            "error": "tool_error",
            "message": "Error executing tool add_note: a note needs some text",
        }
        assert replies[3] == "saved note 1"
        assert traj.reward == 1.0 and traj.metadata["stop_reason"] == "answer"
        assert traj.metrics["tool_calls"] == 4 and traj.metrics["tool_errors"] == 3

        # a second episode runs in a fresh server process: the first one's note is not there
        idle = ScriptedClient(lambda messages: ("Done.", []))
        assert asyncio.run(run_episode(idle, env, scenario, model="m")).reward == 0.0
        assert env.validate(splits=("validation",)).ok  # the task's gold solver scores 1.0, an empty answer 0
    finally:
        env.close()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ("[" * 4000 + "]" * 4000, "arguments are nested too deeply to parse"),  # under the size limit
        ('{"text": ' + "7" * 5000 + "}", "Exceeds the limit (4300 digits)"),  # Python's int-digit limit
    ],
)
def test_hostile_mcp_arguments_are_tool_errors_and_the_episode_goes_on(arguments, message):
    env = make_env(NOTES_SERVER)
    try:
        episode = env.reset(env.scenarios("train")[0])
        try:
            call = {"id": "c1", "function": {"name": "add_note", "arguments": arguments}}
            reply = episode.step(call)
            assert reply["role"] == "tool" and reply["tool_call_id"] == "c1"
            error = json.loads(reply["content"])
            assert error["error"] == "invalid_json" and message in error["message"]
            ok = episode.step({"id": "c2", "function": {"name": "add_note", "arguments": '{"text": "x"}'}})
            assert ok["content"] == "saved note 1"
            assert episode.metrics()["tool_calls"] == 2 and episode.metrics()["tool_errors"] == 1
        finally:
            episode.close()
    finally:
        env.close()


def test_concurrent_mcp_episodes_do_not_share_server_state():
    env = make_env(NOTES_SERVER)
    try:
        scenario = env.scenarios("validation")[1]

        class TwoAgents:  # rollout 0 saves the note, rollout 1 only looks: each in its own server process
            def __init__(self):
                self.chat = self

            @property
            def completions(self):
                return self

            async def create(self, **request):
                first = request["messages"][1]["content"]
                saves = len(request["messages"]) == 2 and not hasattr(self, "saver")
                if saves:
                    self.saver = first
                return await ScriptedClient(
                    lambda m: (
                        ("", [("add_note", {"text": scenario["expected"]})])
                        if len(m) == 2 and saves
                        else ("Done.", [])
                    )
                ).chat.completions.create(**request)

        groups = asyncio.run(gather(make_rollout(env, model="m"), TwoAgents(), [scenario], 2))
        assert sorted(t.reward for t in groups[0].ok) == [0.0, 1.0]
    finally:
        env.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served_support_desk():
    """`grooves env serve support_desk --mcp` on loopback, as a separate process."""
    port = _free_port()
    proc = subprocess.Popen(
        [*GROOVES, "env", "serve", "support_desk", "--mcp", "--port", str(port), "--ttl", "60"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


def test_a_builtin_environment_served_over_mcp_runs_graded_isolated_episodes(served_support_desk):
    local = get_env("support_desk")
    env = McpEnvironment.from_env_server(served_support_desk)
    try:
        listed = env.scenarios("validation")
        assert [s["id"] for s in listed] == [s["id"] for s in local.scenarios("validation")]
        assert all("expected" not in s for s in listed)  # the answers stay on the server
        scenario = local.scenario(listed[0]["id"])
        # two episodes of one scenario at once: the gold solver's refund must not reach the other
        gold_episode, idle_episode = env.reset(listed[0]), env.reset(listed[0])
        assert gold_episode.handle != idle_episode.handle
        assert sorted(t["function"]["name"] for t in gold_episode.tools) == sorted(
            t.name for t in local.spec.tools
        )
        assert gold_episode.messages == local.reset(scenario).messages
        gold = play(gold_episode, local.spec.gold, scenario)
        idle = play(idle_episode, lambda s, c: "Done: refunded.", scenario)
        assert gold_episode.grade(gold).score == 1.0
        assert idle_episode.grade(idle).score < 0.5
        assert gold_episode.grade(gold).score == 1.0  # still 1.0: the idle episode changed nothing here
        assert (
            gold_episode.metrics()["server_env_tool_calls"] >= 1
            and idle_episode.metrics()["server_env_tool_calls"] == 0
        )
        gold_episode.close(), idle_episode.close()
        with pytest.raises(McpError, match="no scenario 'nope'"):
            env.reset({"id": "nope"})
    finally:
        env.close()


def test_each_mcp_session_has_its_own_episode(served_support_desk):
    from mcp import Client

    local = get_env("support_desk")
    scenario = local.scenarios("validation")[0]

    async def main():
        async with (
            Client(served_support_desk, mode="legacy") as one,
            Client(served_support_desk, mode="legacy") as two,
        ):
            opened = await one.call_tool("grooves_reset", {"scenario_id": scenario["id"]})
            assert (
                not opened.is_error
                and opened.structured_content["messages"][1]["content"] == scenario["prompt"]
            )
            email = scenario["prompt"].split("(")[1].split(")")[0]
            found = await one.call_tool(
                "find_customer", {"email": email}
            )  # no handle: this session's episode
            assert not found.is_error and email in found.content[0].text
            other = await two.call_tool("find_customer", {"email": email})  # the other session has none
            assert other.is_error and "call grooves_reset" in other.content[0].text
            graded = await one.call_tool("grooves_grade", {"messages": []})
            assert graded.structured_content["score"] < 0.5
            forged = await two.call_tool("grooves_metrics", {}, meta={"grooves/episode": "not-a-handle"})
            assert forged.is_error and "no session not-a-handle" in forged.content[0].text

    asyncio.run(main())


def test_an_environment_served_over_stdio_trains_through_make_rollout():
    local = get_env("support_desk")
    env = McpEnvironment.from_env_server(
        McpServer(command=(*GROOVES, "env", "serve", "support_desk", "--mcp", "--stdio"), env=ENV)
    )
    try:
        scenario = env.scenarios("train")[0]
        trusted = local.scenario(scenario["id"])
        lookup = ("find_customer", {"email": trusted["email"]})
        # a scripted agent looks the customer up and answers: a rollout through the MCP server
        client = ScriptedClient(lambda m: ("", [lookup]) if len(m) == 2 else ("I could not finish.", []))
        traj = asyncio.run(make_rollout(env, model="m")(client, scenario))
        assert [m["role"] for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
        assert trusted["email"] in traj.messages[3]["content"]  # the server's answer to the tool call
        assert traj.metadata["stop_reason"] == "answer" and 0.0 <= traj.reward < 1.0
        assert traj.metrics["server_env_tool_calls"] == 1
    finally:
        env.close()


def test_stdio_without_mcp_is_refused():
    from typer.testing import CliRunner

    from grooves.cli import app

    result = CliRunner().invoke(app, ["env", "serve", "support_desk", "--stdio"])
    assert result.exit_code == 2 and "add --mcp" in result.output


def test_the_mcp_server_caps_open_episodes_and_expires_idle_ones():
    from mcp import Client

    from grooves.envs.mcp_server import build_server

    now = [0.0]
    server, store = build_server(get_env("support_desk"), ttl_s=60, max_sessions=2, clock=lambda: now[0])
    scenario_id = get_env("support_desk").scenarios("train")[0]["id"]

    async def main():
        async with Client(server, mode="legacy") as client:
            first = await client.call_tool("grooves_reset", {"scenario_id": scenario_id, "bind": False})
            await client.call_tool("grooves_reset", {"scenario_id": scenario_id, "bind": False})
            full = await client.call_tool("grooves_reset", {"scenario_id": scenario_id, "bind": False})
            assert full.is_error and full.structured_content["status"] == 429 and len(store) == 2
            handle = {"grooves/episode": first.structured_content["episode"]}
            assert not (await client.call_tool("grooves_metrics", {}, meta=handle)).is_error
            now[0] += 61  # idle past the TTL
            expired = await client.call_tool("grooves_metrics", {}, meta=handle)
            assert expired.is_error and "expired after 60 s idle" in expired.content[0].text

    asyncio.run(main())
