"""Tool calls: schema validation, hostile and huge inputs, crashes and budgets never end a rollout."""

from __future__ import annotations

import json

import pytest

from grooves.envs import get_env
from grooves.envs.base import Grade, Limits
from grooves.envs.sqlite import EnvSpec, SqliteEnvironment, assign_splits
from grooves.envs.tools import Tool, obj, string

HOSTILE = "'; DROP TABLE issues; --"


def call(name: str, arguments: str | dict, call_id: str = "c1") -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def reply(episode, name, arguments) -> dict:
    message = episode.step(call(name, arguments))
    assert message["role"] == "tool" and message["tool_call_id"] == "c1"
    return json.loads(message["content"])


@pytest.fixture()
def tracker():
    env = get_env("issue_tracker")
    episode = env.reset(env.scenarios("train")[0])
    yield episode
    episode.close()


def test_tools_are_declared_in_openai_format(tracker):
    create = next(t for t in tracker.tools if t["function"]["name"] == "create_issue")
    assert create["type"] == "function"
    params = create["function"]["parameters"]
    assert params["type"] == "object" and params["additionalProperties"] is False
    assert set(params["required"]) == {"project", "title", "type", "priority"}


@pytest.mark.parametrize(
    ("name", "arguments", "kind"),
    [
        ("drop_everything", "{}", "unknown_tool"),
        ("get_issue", "{key: WEB-1", "invalid_json"),
        ("get_issue", "not json at all", "invalid_json"),
        ("get_issue", '["WEB-1"]', "invalid_arguments"),
        ("get_issue", "{}", "schema_violation"),  # missing required field
        ("get_issue", '{"key": 12}', "schema_violation"),  # wrong type
        ("get_issue", '{"key": "WEB-1", "sql": "x"}', "schema_violation"),  # unknown field
        (
            "create_issue",
            {"project": "NOPE", "title": "t", "type": "bug", "priority": "low"},
            "schema_violation",
        ),
        ("get_issue", '{"key": "WEB-99999"}', "refused"),
    ],
)
def test_bad_calls_become_error_messages(tracker, name, arguments, kind):
    body = reply(tracker, name, arguments)
    assert body["error"] == kind
    assert body["message"]
    ok = reply(tracker, "get_issue", {"key": "WEB-1"})  # the episode goes on
    assert ok["key"] == "WEB-1"
    assert tracker.metrics()["env_tool_errors"] == 1.0
    assert tracker.metrics()[f"env_error_{kind}"] == 1.0


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("tool_call", "kind"),
    [
        (
            call("get_issue", "[" * 4000 + "]" * 4000),
            "invalid_json",
        ),  # under the size limit, past the parser's depth
        (
            call("get_issue", '{"key": ' + "7" * 5000 + "}"),
            "invalid_json",
        ),  # past Python's 4300-digit int limit
        (
            {"id": "c1", "function": {"name": "get_issue", "arguments": _nested(5000)}},
            "invalid_tool_call",
        ),  # parsed, too deep
        (
            {"id": "c1", "function": {"name": "get_issue", "arguments": {"key": 10**5000}}},
            "invalid_tool_call",
        ),
        ({"id": "c1", "function": 5}, "invalid_tool_call"),
        ({"id": "c1", "function": {"name": ["get_issue"], "arguments": "{}"}}, "invalid_tool_call"),
        ({"id": {"x": 1}, "function": {"name": "get_issue", "arguments": "{}"}}, "invalid_tool_call"),
    ],
)
def test_hostile_tool_calls_are_error_messages_never_exceptions(tracker, tool_call, kind):
    message = tracker.step(tool_call)
    assert message["role"] == "tool"
    assert json.loads(message["content"])["error"] == kind
    assert tracker.metrics()[f"env_error_{kind}"] == 1.0
    assert reply(tracker, "get_issue", {"key": "WEB-1"})["key"] == "WEB-1"  # the episode goes on


def test_toolbox_run_turns_an_unwritable_result_into_an_error():
    def huge(ctx, args):
        return {"n": 10**5000}  # json.dumps refuses it

    def circular(ctx, args):
        loop: list = []
        loop.append(loop)
        return loop

    spec = EnvSpec(
        name="odd_results",
        description="tools whose results are not JSON",
        system_prompt="call",
        build_seed=lambda conn, s: conn.execute("CREATE TABLE t (x)"),
        make_scenarios=lambda conn, s: assign_splits("odd_results", [{"prompt": "go", "expected": {}}] * 5),
        tools=[Tool("huge", "a huge number", obj({}), huge), Tool("circular", "a loop", obj({}), circular)],
        grade=lambda g: Grade(score=1.0),
        gold=lambda s, c: "",
        bad=lambda s: [],
    )
    env = SqliteEnvironment(spec)
    episode = env.reset(env.scenarios("train")[0])
    assert reply(episode, "huge", {})["error"] == "tool_crashed"
    assert reply(episode, "circular", {})["error"] == "tool_crashed"
    assert episode.metrics()["env_error_tool_crashed"] == 2.0


def test_huge_arguments_are_refused_before_parsing(tracker):
    limit = tracker.env.limits.max_argument_chars
    huge = json.dumps({"query": "x" * (limit + 10)})
    body = reply(tracker, "search_issues", huge)
    assert body["error"] == "arguments_too_large"
    assert str(limit) in body["message"]
    # Under the size limit but over the field's maxLength: a schema error, quoted briefly.
    long = reply(tracker, "search_issues", {"query": "y" * 5000})
    assert long["error"] == "schema_violation"
    assert len(long["message"]) <= 300 and long["message"].endswith("is too long")


def test_sql_in_a_string_is_stored_and_found_as_data(tracker):
    made = reply(
        tracker,
        "create_issue",
        {
            "project": "OPS",
            "title": HOSTILE,
            "type": "bug",
            "priority": "high",
            "description": "Robert'); DROP TABLE links;--",
        },
    )
    key = made["created"]
    found = reply(tracker, "search_issues", {"query": "DROP TABLE"})["issues"]
    assert [i["title"] for i in found] == [HOSTILE]
    assert reply(tracker, "get_issue", {"key": key})["description"] == "Robert'); DROP TABLE links;--"
    tables = {r["name"] for r in tracker.state.query("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"issues", "links", "comments"} <= tables
    assert tracker.state.one("SELECT count(*) AS n FROM issues")["n"] == 241
    # LIKE wildcards from the model are literal: '%' matches only titles containing '%'.
    assert reply(tracker, "search_issues", {"query": "%"})["issues"] == []
    assert reply(tracker, "find_user", {"name": "_"})["users"] == []


def test_hostile_strings_in_search_and_lookups_elsewhere():
    for name, tool, args in [
        ("support_desk", "find_customer", {"email": "' OR '1'='1"}),
        ("flight_booking", "find_passenger", {"email": "x@y.z'; DELETE FROM bookings; --"}),
        ("corpus_search", "search", {"query": HOSTILE + ' NEAR("x" "y") title:*'}),
    ]:
        env = get_env(name)
        episode = env.reset(env.scenarios("train")[0])
        before = episode.snapshot()
        body = reply(episode, tool, args)
        if name == "corpus_search":
            assert isinstance(body["results"], list)  # FTS syntax in the query is just words
        else:
            assert body["error"] == "refused"  # no such customer: the quote did not break out
        restored = episode.fork()
        restored.restore(before)
        for table in ("customers", "bookings", "docs"):
            exists = episode.state.one("SELECT count(*) AS n FROM sqlite_master WHERE name = ?", (table,))[
                "n"
            ]
            if exists:
                n = episode.state.one(f"SELECT count(*) AS n FROM {table}")["n"]
                assert n == restored.state.one(f"SELECT count(*) AS n FROM {table}")["n"] > 0
        episode.close()


def _crashing_env() -> SqliteEnvironment:
    def seed(conn, _seed):
        conn.execute("CREATE TABLE counter (n INTEGER NOT NULL)")
        conn.execute("INSERT INTO counter VALUES (0)")

    def bump(ctx, args):
        ctx.state.execute("UPDATE counter SET n = n + 1")
        return ctx.state.one("SELECT n FROM counter")

    def explode(ctx, args):
        ctx.state.conn.execute("UPDATE counter SET n = n + 100")  # left uncommitted: must be rolled back
        return 1 / 0

    spec = EnvSpec(
        name="crashy",
        description="a tool with a bug",
        system_prompt="count",
        build_seed=seed,
        make_scenarios=lambda conn, s: assign_splits("crashy", [{"prompt": "go", "expected": {}}] * 5),
        tools=[
            Tool("bump", "add one", obj({}), bump, latency_s=1.0),
            Tool("explode", "a bug", obj({"why": string("why", 20)}), explode, latency_s=1.0),
        ],
        grade=lambda g: Grade(score=1.0),
        gold=lambda s, c: "",
        bad=lambda s: [],
        limits=Limits(latency_budget_s=3.5),
    )
    return SqliteEnvironment(spec)


def test_a_crashing_tool_is_an_error_message_and_its_writes_roll_back():
    env = _crashing_env()
    episode = env.reset(env.scenarios("train")[0])
    assert reply(episode, "bump", {}) == {"n": 1}
    crashed = reply(episode, "explode", {})
    assert crashed["error"] == "tool_crashed" and "ZeroDivisionError" in crashed["message"]
    assert reply(episode, "bump", {}) == {"n": 2}


def test_simulated_latency_budget_ends_the_episode():
    env = _crashing_env()
    episode = env.reset(env.scenarios("train")[0])
    for expected in (1, 2, 3):  # 1 s each against a 3.5 s budget
        assert reply(episode, "bump", {}) == {"n": expected}
    assert not episode.done
    refused = reply(episode, "bump", {})
    assert refused["error"] == "budget_exhausted"
    assert episode.done
    assert episode.state.one("SELECT n FROM counter")["n"] == 3
    assert episode.metrics()["env_elapsed_s"] == 3.0


def test_corpus_search_budget_counts_simulated_seconds():
    env = get_env("corpus_search")
    episode = env.reset(env.scenarios("validation")[0])
    assert env.limits.latency_budget_s == 12.0
    results = []
    for i in range(10):  # search costs 1.5 s: eight fit in 12 s
        results.append(reply(episode, "search", {"query": f"town founded {i}"}))
    assert all("results" in r for r in results[:8])
    assert [r.get("error") for r in results[8:]] == ["budget_exhausted", "budget_exhausted"]
    assert episode.metrics()["env_elapsed_s"] == 12.0
    assert episode.done


def test_noisy_ranking_is_reproducible_per_episode_and_truncates_snippets():
    env = get_env("corpus_search")
    scenario = env.scenarios("validation")[0]
    runs = []
    for _ in range(2):
        episode = env.reset(scenario)
        runs.append(reply(episode, "search", {"query": scenario["prompt"], "k": 8}))
        episode.close()
    assert runs[0] == runs[1]
    snippets = [r["snippet"] for r in runs[0]["results"]]
    assert all(len(s) <= 73 for s in snippets)
    page = reply(env.reset(scenario), "read", {"doc_id": runs[0]["results"][0]["doc_id"]})
    assert len(page["text"]) <= 300


def test_real_clock_charges_measured_time():
    spec = _crashing_env().spec
    env = SqliteEnvironment(spec, limits=Limits(clock="real", latency_budget_s=1e-9))
    episode = env.reset(env.scenarios("train")[0])
    assert reply(episode, "bump", {}) == {"n": 1}  # runs: the real cost is known only afterwards
    elapsed = episode.metrics()["env_elapsed_s"]
    assert 0.0 < elapsed != 1.0  # measured, not the declared 1.0 s
    assert episode.done
    assert reply(episode, "bump", {})["error"] == "budget_exhausted"
