"""The environment server over real HTTP: isolation, snapshots, expiry, JSON errors, remote rollouts."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest
from fastapi.testclient import TestClient
from test_envs_rollout import ScriptedClient, refund_scenario, support_agent
from test_envs_state import RECURSIVE_VIEW, tampered
from typer.testing import CliRunner

from grooves.cli import app as cli_app
from grooves.envs import get_env, run_episode
from grooves.envs.base import SPLITS, Environment, Episode, Grade, public_scenario
from grooves.envs.registry import BUILTINS
from grooves.envs.remote import RemoteEnvError, RemoteEnvironment
from grooves.envs.server import create_app
from grooves.envs.sqlite import EnvSpec, SqliteEnvironment, assign_splits
from grooves.envs.tools import Tool, obj
from grooves.scale.policy_server import ThreadedServer


@contextmanager
def http_server(app):
    """The app on a free loopback port in a background thread; yields the base URL."""
    with ThreadedServer(app) as server:
        yield server.base_url


def tool_call(name, args, call_id="c1"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def tracker_url():
    with http_server(create_app(get_env("issue_tracker"), ttl_s=600)) as url:
        yield url


def test_two_concurrent_sessions_are_isolated(tracker_url):
    remote = RemoteEnvironment(tracker_url)
    scenario = remote.scenarios("train")[0]
    a, b = remote.reset(scenario), remote.reset(scenario)
    assert isinstance(a, Episode) and a.session_id != b.session_id

    def work(episode, tag):
        keys = []
        for i in range(15):
            created = json.loads(
                episode.step(
                    tool_call(
                        "create_issue",
                        {"project": "API", "title": f"{tag} issue {i}", "type": "task", "priority": "low"},
                    )
                )["content"]
            )
            keys.append(created["created"])
        return keys

    with ThreadPoolExecutor(max_workers=2) as pool:  # both sessions write at the same time
        keys_a, keys_b = pool.map(work, [a, b], ["alpha", "beta"])
    assert keys_a == keys_b  # the same new keys, each in its own world
    for episode, mine, theirs in [(a, "alpha", "beta"), (b, "beta", "alpha")]:
        own = json.loads(episode.step(tool_call("search_issues", {"query": f"{mine} issue"}))["content"])[
            "issues"
        ]
        other = json.loads(episode.step(tool_call("search_issues", {"query": f"{theirs} issue"}))["content"])[
            "issues"
        ]
        assert len(own) == 10 and other == []  # search returns at most 10
        assert episode.metrics()["env_tool_calls"] == 17
    key = keys_a[-1]
    assert json.loads(a.step(tool_call("get_issue", {"key": key}))["content"])["title"] == "alpha issue 14"
    assert json.loads(b.step(tool_call("get_issue", {"key": key}))["content"])["title"] == "beta issue 14"
    a.close()
    assert json.loads(b.step(tool_call("get_issue", {"key": key}))["content"])["title"] == "beta issue 14"
    b.close()
    remote.close()


def test_a_split_the_server_lacks_is_a_value_error_like_a_local_one(tracker_url):
    remote = RemoteEnvironment(tracker_url)
    assert len(remote.scenarios("test")) == 100
    with pytest.raises(ValueError, match="split 'holdout': split must be one of"):
        remote.scenarios("holdout")
    with pytest.raises(ValueError):
        get_env("issue_tracker").scenarios("holdout")  # type: ignore[arg-type]
    remote.close()


def test_snapshot_restore_and_fork_over_http(tracker_url):
    remote = RemoteEnvironment(tracker_url)
    episode = remote.reset(remote.scenarios("validation")[0])
    episode.step(tool_call("add_comment", {"key": "WEB-1", "body": "kept"}))
    snap = episode.snapshot()
    assert snap[:16] == b"SQLite format 3\x00"
    child = episode.fork()
    episode.step(tool_call("add_comment", {"key": "WEB-1", "body": "dropped"}))
    assert episode.snapshot() != snap
    episode.restore(snap)
    assert episode.snapshot() == snap
    assert child.snapshot() == snap
    child.step(tool_call("add_comment", {"key": "WEB-1", "body": "only in the child"}))
    comments = json.loads(episode.step(tool_call("get_issue", {"key": "WEB-1"}))["content"])["comments"]
    assert comments[-1] == "kept" and "only in the child" not in comments
    with pytest.raises(RemoteEnvError, match="400.*not a snapshot"):
        episode.restore(b"garbage" * 50)
    for e in (episode, child):
        e.close()
    remote.close()


def test_errors_are_json_4xx(tracker_url):
    with httpx.Client(base_url=tracker_url) as http:
        missing = http.post(
            "/sessions/not-a-session/step", json={"tool_call": tool_call("get_issue", {"key": "X"})}
        )
        assert missing.status_code == 404 and missing.json()["detail"] == "no session not-a-session"
        bad_scenario = http.post("/sessions", json={"scenario": {"id": "nope"}})
        assert bad_scenario.status_code == 400 and "no scenario 'nope'" in bad_scenario.json()["detail"]
        no_id = http.post("/sessions", json={"scenario": {"prompt": "x"}})
        assert no_id.status_code == 400
        malformed = http.post("/sessions", content=b"{not json", headers={"content-type": "application/json"})
        assert malformed.status_code == 422 and "detail" in malformed.json()
        extra = http.post("/sessions", json={"scenario": {}, "sql": "DROP TABLE"})
        assert extra.status_code == 422
        huge = http.post(
            "/sessions", content=b"x" * (33 * 2**20), headers={"content-type": "application/json"}
        )
        assert huge.status_code == 413 and huge.json()["error"] == "body_too_large"
        split = http.get("/scenarios", params={"split": "holdout"})
        assert split.status_code == 400
        info = http.get("/env").json()
        assert info["name"] == "issue_tracker" and info["scenarios"] == {
            "train": 80,
            "validation": 20,
            "test": 100,
        }


def test_idle_sessions_expire():
    clock = FakeClock()
    app = create_app(get_env("support_desk"), ttl_s=60, clock=clock)
    with http_server(app) as url:
        remote = RemoteEnvironment(url)
        scenario = remote.scenarios("train")[0]
        idle, active, swept = remote.reset(scenario), remote.reset(scenario), remote.reset(scenario)
        clock.now += 45
        active.step(tool_call("get_product", {"product_id": "P01"}))  # touching it resets its idle time
        clock.now += 30
        with pytest.raises(RemoteEnvError, match="404.*expired after 60 s idle"):
            idle.step(tool_call("get_product", {"product_id": "P01"}))
        assert "P01" in active.step(tool_call("get_product", {"product_id": "P01"}))["content"]
        assert app.state.store.sweep() == 1  # `swept` was idle too; the sweep closes it
        with pytest.raises(RemoteEnvError, match="404"):
            swept.metrics()
        assert len(app.state.store) == 1
        active.close()
        remote.close()


def _fragile_env() -> SqliteEnvironment:
    def seed(conn, _seed):
        conn.execute("CREATE TABLE hits (n INTEGER)")
        conn.execute("INSERT INTO hits VALUES (0)")

    def hit(ctx, args):
        ctx.state.execute("UPDATE hits SET n = n + 1")
        return ctx.state.one("SELECT n FROM hits")

    def crash(ctx, args):
        raise RuntimeError("the tool's backend fell over")

    def grade(g):
        if "crash" in g.answer:
            raise RuntimeError("grader bug")
        return Grade(score=1.0 if g.answer else 0.0)

    spec = EnvSpec(
        name="fragile",
        description="tools and a grader that can fail",
        system_prompt="hit things",
        build_seed=seed,
        make_scenarios=lambda conn, s: assign_splits("fragile", [{"prompt": "go", "expected": {}}] * 5),
        tools=[Tool("hit", "count", obj({}), hit), Tool("crash", "fails", obj({}), crash)],
        grade=grade,
        gold=lambda s, c: "ok",
        bad=lambda s: [],
    )
    return SqliteEnvironment(spec)


def test_a_crash_in_one_session_does_not_affect_others():
    with http_server(create_app(_fragile_env())) as url:
        remote = RemoteEnvironment(url)
        scenario = remote.scenarios("train")[0]
        broken, healthy = remote.reset(scenario), remote.reset(scenario)
        assert json.loads(healthy.step(tool_call("hit", {}))["content"]) == {"n": 1}
        crashed = json.loads(broken.step(tool_call("crash", {}))["content"])
        assert crashed["error"] == "tool_crashed" and "fell over" in crashed["message"]
        with pytest.raises(RemoteEnvError, match="500.*grader bug"):
            broken.grade([{"role": "assistant", "content": "crash"}])
        assert json.loads(healthy.step(tool_call("hit", {}))["content"]) == {"n": 2}
        assert json.loads(broken.step(tool_call("hit", {}))["content"]) == {"n": 1}  # and it still works
        assert healthy.grade([{"role": "assistant", "content": "fine"}]).score == 1.0
        for e in (broken, healthy):
            e.close()
        remote.close()


def test_too_many_sessions_is_429():
    with http_server(create_app(_fragile_env(), max_sessions=2)) as url:
        remote = RemoteEnvironment(url)
        scenario = remote.scenarios("train")[0]
        first = [remote.reset(scenario), remote.reset(scenario)]
        with pytest.raises(RemoteEnvError, match="429"):
            remote.reset(scenario)
        first[0].close()
        remote.reset(scenario).close()
        remote.close()


def test_a_remote_environment_runs_episodes_like_a_local_one():
    local = get_env("support_desk")
    scenario = refund_scenario(local)
    with http_server(create_app(local)) as url:
        remote = RemoteEnvironment(url)
        assert isinstance(remote, Environment) and isinstance(local, Environment)
        assert remote.name == "support_desk" and remote.limits == local.limits
        assert remote.scenarios("validation") == [public_scenario(s) for s in local.scenarios("validation")]
        far = asyncio.run(
            run_episode(ScriptedClient(support_agent(scenario)), remote, scenario, model="m", max_turns=6)
        )
        near = asyncio.run(
            run_episode(ScriptedClient(support_agent(scenario)), local, scenario, model="m", max_turns=6)
        )
        assert far.messages == near.messages
        assert far.reward == near.reward == 1.0 and far.rewards == near.rewards
        assert far.metrics["env_tool_calls"] == near.metrics["env_tool_calls"] == 3
        report = remote.validate()
        assert report.ok and report.scenarios == 200
        assert httpx.get(f"{url}/env").json()["sessions"] == 0  # run_episode closed its session
        remote.close()


def test_cli_lists_and_validates():
    runner = CliRunner()
    listed = runner.invoke(cli_app, ["env", "list"])
    assert listed.exit_code == 0
    for name in ("support_desk", "issue_tracker", "flight_booking", "corpus_search"):
        assert f"{name}:" in listed.output
    checked = runner.invoke(cli_app, ["env", "validate", "corpus_search"])
    assert checked.exit_code == 0 and "min gold 1.000" in checked.output and ": ok" in checked.output
    shown = runner.invoke(cli_app, ["env", "scenarios", "support_desk", "--limit", "2"])
    lines = [json.loads(line) for line in shown.output.strip().splitlines()]
    assert len(lines) == 2 and all(s["split"] == "validation" for s in lines)


def _leaves(value) -> list[str]:
    """The strings and numbers inside a (nested) answer, as text."""
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [str(value)] if isinstance(value, str | int | float) and not isinstance(value, bool) else []


@pytest.mark.parametrize("name", BUILTINS)
def test_listed_scenarios_carry_no_answers(name):
    env = get_env(name)
    client = TestClient(create_app(env))
    hidden = 0
    for split in SPLITS:
        listed = client.get("/scenarios", params={"split": split}).json()
        full = env.scenarios(split)
        assert [s["id"] for s in listed] == [s["id"] for s in full]
        for served, scenario in zip(listed, full, strict=True):
            assert "expected" not in served and served["prompt"] == scenario["prompt"]
            text = json.dumps(served)
            # answers of four characters or more (shorter ones turn up by chance, "1" in an email)
            secret = [x for x in _leaves(scenario["expected"]) if len(x) >= 4 and x not in scenario["prompt"]]
            assert not [leaf for leaf in secret if leaf in text]  # no answer the prompt does not already say
            hidden += len(secret)
    assert hidden > 0


def test_restore_over_http_checks_schema_size_and_streamed_body():
    env = get_env("issue_tracker")
    with http_server(create_app(env, max_snapshot_bytes=200_000, max_body_bytes=300_000)) as url:
        remote = RemoteEnvironment(url)
        episode = remote.reset(remote.scenarios("train")[0])
        snap = episode.snapshot()
        assert len(snap) < 200_000
        with pytest.raises(RemoteEnvError, match="400.*'view spin'"):
            episode.restore(tampered(snap, RECURSIVE_VIEW))
        big = tampered(
            snap, "INSERT INTO comments (issue_key, body) VALUES ('WEB-1', hex(randomblob(70000)))"
        )
        assert 200_000 < len(big) < 300_000  # under the body limit, over the snapshot limit
        with pytest.raises(RemoteEnvError, match="413.*at most 200000"):
            episode.restore(big)
        with httpx.Client(base_url=url) as http:  # a chunked upload has no content-length to check up front
            chunked = http.put(f"/sessions/{episode.session_id}/snapshot", content=iter([b"x" * 100_000] * 4))
        assert chunked.request.headers.get("transfer-encoding") == "chunked"
        assert chunked.status_code == 413 and chunked.json()["error"] == "body_too_large"
        assert episode.snapshot() == snap
        assert json.loads(episode.step(tool_call("get_issue", {"key": "WEB-1"}))["content"])["key"] == "WEB-1"
        episode.close()
        remote.close()


def test_an_empty_body_is_a_4xx_naming_it_on_every_route_that_takes_one(tracker_url):
    with httpx.Client(base_url=tracker_url) as http:
        scenario = http.get("/scenarios").json()[0]
        sid = http.post("/sessions", json={"scenario": scenario}).json()["session_id"]
        snap = http.get(f"/sessions/{sid}/snapshot").content
        empty = http.put(f"/sessions/{sid}/snapshot", content=b"")
        assert empty.status_code == 400
        assert empty.json() == {
            "error": "refused",
            "detail": "the request body is empty: PUT the bytes that GET /sessions/ID/snapshot returned",
        }
        for path in (
            "/sessions",
            f"/sessions/{sid}/reset",
            f"/sessions/{sid}/step",
            f"/sessions/{sid}/grade",
        ):
            resp = http.post(path, content=b"", headers={"content-type": "application/json"})
            problem = resp.json()["detail"][0]
            assert resp.status_code == 422 and problem["loc"] == ["body"] and problem["type"] == "missing"
        assert http.get(f"/sessions/{sid}/snapshot").content == snap  # the session is untouched
        http.delete(f"/sessions/{sid}")


def test_restoring_an_empty_snapshot_locally_is_a_value_error():
    env = get_env("issue_tracker")
    episode = env.reset(env.scenarios("train")[0])
    snap = episode.snapshot()
    with pytest.raises(ValueError, match="not a snapshot of a issue_tracker episode: it is empty"):
        episode.restore(b"")
    assert episode.snapshot() == snap
    episode.close()


def test_a_malformed_tool_call_over_http_is_a_tool_error(tracker_url):
    with httpx.Client(base_url=tracker_url) as http:
        scenario = http.get("/scenarios").json()[0]
        sid = http.post("/sessions", json={"scenario": scenario}).json()["session_id"]
        for bad in (
            {"function": 5},
            {"id": "c", "function": {"name": "get_issue", "arguments": '{"key": ' + "9" * 5000 + "}"}},
        ):
            resp = http.post(f"/sessions/{sid}/step", json={"tool_call": bad})
            assert resp.status_code == 200
            assert json.loads(resp.json()["message"]["content"])["error"] in (
                "invalid_tool_call",
                "invalid_json",
            )
        http.delete(f"/sessions/{sid}")


def test_a_500_leaves_the_keep_alive_connection_open():
    with http_server(create_app(_fragile_env())) as url, httpx.Client(base_url=url) as http:
        scenario = http.get("/scenarios").json()[0]
        sid = http.post("/sessions", json={"scenario": scenario}).json()["session_id"]
        crashed = http.post(
            f"/sessions/{sid}/grade", json={"messages": [{"role": "assistant", "content": "crash"}]}
        )
        first = crashed.extensions["network_stream"].get_extra_info("client_addr")
        after = http.post(f"/sessions/{sid}/step", json={"tool_call": tool_call("hit", {})})
        second = after.extensions["network_stream"].get_extra_info("client_addr")
    assert crashed.status_code == 500 and crashed.json() == {
        "error": "internal",
        "detail": "GraderError: fragile: grader grade raised RuntimeError: grader bug (scenario 'fragile-000')",
    }
    assert after.status_code == 200 and json.loads(after.json()["message"]["content"]) == {"n": 1}
    assert first == second  # one connection carried both
