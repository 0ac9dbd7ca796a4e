"""Episode state: seeded copies, byte-identical snapshot/restore, independent forks."""

from __future__ import annotations

import sqlite3

import pytest

from grooves.envs import get_env
from grooves.envs.state import SeedDatabase, SqliteState, changed_keys, like_pattern


def _seed(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
    conn.executemany("INSERT INTO notes (body) VALUES (?)", [(f"note {i}",) for i in range(50)])


@pytest.fixture()
def seed() -> SeedDatabase:
    return SeedDatabase(_seed)


@pytest.mark.parametrize("on_disk", [False, True])
def test_snapshot_then_restore_is_byte_identical(seed, on_disk):
    state = SqliteState.from_seed(seed, on_disk=on_disk)
    assert (state.path is not None) == on_disk
    state.execute("INSERT INTO notes (body) VALUES (?)", ("before snapshot",))
    snap = state.snapshot()
    state.execute("DELETE FROM notes WHERE id < ?", (30,))
    state.execute("INSERT INTO notes (body) VALUES (?)", ("after snapshot",))
    assert state.snapshot() != snap
    state.restore(snap)
    assert state.snapshot() == snap
    assert state.one("SELECT count(*) AS n FROM notes")["n"] == 51
    if on_disk:
        assert state.path.exists()
        path = state.path
        state.close()
        assert not path.exists()


def test_copy_from_seed_has_the_seed_rows_and_leaves_the_seed_alone(seed):
    a = SqliteState.from_seed(seed)
    a.execute("DELETE FROM notes")
    b = SqliteState.from_seed(seed)
    assert a.one("SELECT count(*) AS n FROM notes")["n"] == 0
    assert b.one("SELECT count(*) AS n FROM notes")["n"] == 50
    assert seed.connection.execute("SELECT count(*) FROM notes").fetchone()[0] == 50


def test_fork_gives_independent_branches(seed):
    trunk = SqliteState.from_seed(seed)
    trunk.execute("UPDATE notes SET body = ? WHERE id = 1", ("trunk edit",))
    branch = trunk.fork()
    assert branch.snapshot() == trunk.snapshot()
    branch.execute("UPDATE notes SET body = ? WHERE id = 1", ("branch edit",))
    trunk.execute("INSERT INTO notes (body) VALUES (?)", ("trunk only",))
    assert trunk.one("SELECT body FROM notes WHERE id = 1")["body"] == "trunk edit"
    assert branch.one("SELECT body FROM notes WHERE id = 1")["body"] == "branch edit"
    assert trunk.one("SELECT count(*) AS n FROM notes")["n"] == 51
    assert branch.one("SELECT count(*) AS n FROM notes")["n"] == 50


def test_changed_keys_sees_inserts_updates_and_deletes(seed):
    state = SqliteState.from_seed(seed)
    state.execute("UPDATE notes SET body = 'x' WHERE id = 3")
    state.execute("DELETE FROM notes WHERE id = 7")
    state.execute("INSERT INTO notes (id, body) VALUES (99, 'new')")
    assert changed_keys(seed.connection, state.conn, "notes", "id") == {3, 7, 99}
    with pytest.raises(ValueError, match="no column 'nope'"):
        changed_keys(seed.connection, state.conn, "notes", "nope")


def test_like_pattern_treats_wildcards_as_data(seed):
    state = SqliteState.from_seed(seed)
    state.execute("INSERT INTO notes (body) VALUES (?)", ("50%_off",))
    sql = "SELECT body FROM notes WHERE body LIKE ? ESCAPE '\\'"
    assert [r["body"] for r in state.query(sql, (like_pattern("%"),))] == ["50%_off"]
    assert [r["body"] for r in state.query(sql, (like_pattern("_"),))] == ["50%_off"]
    assert len(state.query(sql, (like_pattern("note"),))) == 50


@pytest.mark.parametrize("name", ["support_desk", "issue_tracker", "flight_booking", "corpus_search"])
def test_episode_snapshot_carries_clock_and_restores_exactly(name):
    env = get_env(name)
    episode = env.reset(env.scenarios("train")[0])
    first_tool = episode.tools[0]["function"]["name"]
    episode.step({"id": "a", "function": {"name": first_tool, "arguments": "{}"}})
    snap = episode.snapshot()
    calls_before = episode.metrics()["env_tool_calls"]
    for _ in range(3):
        episode.step({"id": "b", "function": {"name": "no_such_tool", "arguments": "{}"}})
    assert episode.metrics()["env_tool_calls"] == calls_before + 3
    episode.restore(snap)
    assert episode.snapshot() == snap
    assert episode.metrics()["env_tool_calls"] == calls_before
    with pytest.raises(ValueError, match="not a snapshot"):
        episode.restore(b"this is not a database" * 100)
    assert episode.snapshot() == snap  # a refused restore leaves the state as it was
    episode.close()


def test_episodes_of_one_environment_share_nothing():
    env = get_env("issue_tracker")
    scenario = env.scenarios("train")[0]
    a, b = env.reset(scenario), env.reset(scenario)
    made = a.step(
        {
            "id": "1",
            "function": {
                "name": "create_issue",
                "arguments": '{"project": "WEB", "title": "only in a", "type": "task", "priority": "low"}',
            },
        }
    )
    assert "created" in made["content"]
    find = {"id": "2", "function": {"name": "search_issues", "arguments": '{"query": "only in a"}'}}
    assert '"issues": []' not in a.step(find)["content"]
    assert '"issues": []' in b.step(find)["content"]


def test_on_disk_episodes_snapshot_restore_and_clean_up():
    env = get_env("flight_booking", on_disk=True)
    episode = env.reset(env.scenarios("train")[0])
    path = episode.state.path
    assert path is not None and path.exists()
    snap = episode.snapshot()
    episode.step(
        {
            "id": "a",
            "function": {"name": "hold_seat", "arguments": '{"flight_id": "GR101", "passenger_id": "PS001"}'},
        }
    )
    assert episode.snapshot() != snap
    episode.restore(snap)
    assert episode.snapshot() == snap and path.read_bytes() == snap
    with pytest.raises(ValueError, match="not a snapshot"):
        episode.restore(b"\x00" * 4096)
    assert episode.snapshot() == snap
    episode.close()
    assert not path.exists()


def tampered(snapshot: bytes, *statements: str) -> bytes:
    """A snapshot changed by SQL run on a copy of it (what a hostile client could upload)."""
    conn = sqlite3.connect(":memory:")
    conn.deserialize(snapshot)
    for sql in statements:
        conn.execute(sql)
    conn.commit()
    data = conn.serialize()
    conn.close()
    return data


RECURSIVE_VIEW = (
    "CREATE VIEW spin AS WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 1000000000) "
    "SELECT count(*) AS n FROM c"
)


@pytest.mark.parametrize(
    ("statement", "named"),
    [
        (RECURSIVE_VIEW, "view spin"),
        (
            "CREATE TRIGGER slow AFTER INSERT ON comments BEGIN SELECT count(*) FROM issues a, issues b, issues c; END",
            "trigger slow",
        ),
        ("CREATE INDEX by_title ON issues(title)", "index by_title"),
        ("CREATE TABLE extra (x)", "table extra"),
        ("ALTER TABLE issues ADD COLUMN secret TEXT", "table issues"),
        ("DROP TABLE comments", "table comments"),
    ],
)
def test_restore_refuses_a_database_whose_schema_is_not_the_seeds(statement, named):
    env = get_env("issue_tracker")
    episode = env.reset(env.scenarios("train")[0])
    snap = episode.snapshot()
    with pytest.raises(
        ValueError, match=f"not a snapshot of a issue_tracker episode: its schema .*'{named}'"
    ):
        episode.restore(tampered(snap, statement))
    assert episode.snapshot() == snap  # a refused restore leaves the state as it was
    same_schema = tampered(snap, "UPDATE issues SET title = 'edited' WHERE key = 'WEB-1'")
    episode.restore(same_schema)  # other rows, same schema: a snapshot like any other
    assert episode.state.one("SELECT title FROM issues WHERE key = 'WEB-1'")["title"] == "edited"
    episode.close()


def test_restore_refuses_a_damaged_database():
    env = get_env("issue_tracker")
    episode = env.reset(env.scenarios("train")[0])
    snap = episode.snapshot()
    page = episode.state.one("PRAGMA page_size")["page_size"]
    root = episode.state.one("SELECT rootpage FROM sqlite_schema WHERE name = 'issues'")["rootpage"]
    damaged = bytearray(snap)
    start = (root - 1) * page
    damaged[start : start + page] = b"\xff" * page  # the issues table's root page
    with pytest.raises(
        ValueError, match="not a snapshot of a issue_tracker episode: the database is damaged"
    ):
        episode.restore(bytes(damaged))
    assert episode.snapshot() == snap
    episode.close()
