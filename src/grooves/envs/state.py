"""Ephemeral SQLite state for one rollout: copied from a seed, snapshotted, restored, forked.

Each episode gets its own connection, made by copying a seed database with SQLite's online
backup API (page copies, no SQL re-run), which is what makes a reset cheap enough to do for every
rollout (see benchmarks/bench_env_reset.py). `snapshot()` is `Connection.serialize()`: the whole
database as bytes, so restoring it gives back byte-identical state, and forks share nothing.

Every query takes bound parameters; text from a model is only ever a parameter value, never
part of a statement (`like_pattern` escapes LIKE wildcards so `%` in a search is data too).

Snapshot bytes may come from outside (the environment server restores what a client uploads),
and a SQLite file carries code: views, triggers and indexes run on every query that touches them
(a recursive view can hold a tool call, and the server thread running it, for as long as it
likes). `check_snapshot` therefore opens the bytes on a scratch connection first and accepts
only an intact database whose schema is exactly the seed's.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

SeedBuilder = Callable[[sqlite3.Connection], None]
"""Fills an empty database with a schema and rows; run once per seed, then copied."""


def connect(path: str | Path | None = None) -> sqlite3.Connection:
    """A connection usable from the rollout loop's worker threads (one user at a time)."""
    conn = sqlite3.connect(":memory:" if path is None else str(path), check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


class SeedDatabase:
    """A read-only template database that episodes are copied from.

    The template is built once by `builder`; copies use the backup API under a lock, because a
    backup reads the source connection and several rollouts may reset at the same moment.
    """

    def __init__(self, builder: SeedBuilder):
        self._conn = connect()
        builder(self._conn)
        self._conn.commit()
        self._lock = threading.Lock()
        self.schema = schema_of(self._conn)
        """Every table, index, view and trigger with its SQL; a restored snapshot must have exactly these."""

    @property
    def connection(self) -> sqlite3.Connection:
        """The template itself, for graders that compare an episode's end state with the start."""
        return self._conn

    def copy_into(self, target: sqlite3.Connection) -> None:
        with self._lock:
            self._conn.backup(target)

    def serialize(self) -> bytes:
        with self._lock:
            return self._conn.serialize()


class SqliteState:
    """One rollout's database. In memory by default; `path` (or `on_disk=True`) uses a file."""

    def __init__(self, conn: sqlite3.Connection, path: Path | None = None):
        self.conn = conn
        self.path = path

    @classmethod
    def from_seed(
        cls, seed: SeedDatabase, *, on_disk: bool = False, path: str | Path | None = None
    ) -> SqliteState:
        if on_disk and path is None:
            fd, name = tempfile.mkstemp(prefix="grooves-env-", suffix=".sqlite")
            os.close(fd)
            path = Path(name)
        conn = connect(path)
        seed.copy_into(conn)
        return cls(conn, Path(path) if path is not None else None)

    def snapshot(self) -> bytes:
        """The whole database as bytes (`sqlite3.Connection.serialize`)."""
        self.conn.commit()
        return self.conn.serialize()

    def restore(self, data: bytes) -> None:
        """Replace the database with a snapshot's bytes.

        In memory, `deserialize` swaps the pages in place. A file-backed state rewrites its file
        and reconnects: `deserialize` would detach it from the file, and the backup API would
        bump the header's change counter, so the bytes would no longer match the snapshot.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"restore expects the bytes of snapshot(), got {type(data).__name__}")
        self.conn.commit()
        if self.path is None:
            self.conn.deserialize(bytes(data))
            return
        self.conn.close()
        self.path.write_bytes(bytes(data))
        self.conn = connect(self.path)

    def fork(self) -> SqliteState:
        """An independent copy in memory: changes to either never reach the other."""
        conn = connect()
        self.conn.commit()
        self.conn.backup(conn)
        return SqliteState(conn)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return [dict(row) for row in self.conn.execute(sql, tuple(params)).fetchall()]

    def one(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
        row = self.conn.execute(sql, tuple(params)).fetchone()
        return dict(row) if row is not None else None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one write in its own transaction; returns the new rowid (for inserts)."""
        with self.conn:
            cur = self.conn.execute(sql, tuple(params))
        return int(cur.lastrowid or 0)

    def close(self) -> None:
        self.conn.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)


def schema_of(conn: sqlite3.Connection) -> list[tuple[str, str, str, str]]:
    """(type, name, table, SQL) of every schema entry, sorted: two databases with equal lists have one schema."""
    rows = conn.execute("SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_schema").fetchall()
    return sorted(tuple(r) for r in rows)


def check_snapshot(data: bytes, seed: SeedDatabase) -> None:
    """Raise ValueError unless `data` is an intact SQLite database with exactly `seed`'s schema.

    The bytes are opened on a scratch connection that runs no query of theirs: only the schema
    table and `PRAGMA quick_check` (page structure, bounded by the size) are read. An extra or
    changed table, column, index, view or trigger is refused, so nothing restored can run code
    the environment did not write.
    """
    if not data:  # sqlite's deserialize raises MemoryError on zero bytes
        raise ValueError("it is empty (0 bytes)")
    conn = sqlite3.connect(":memory:")
    try:
        conn.deserialize(bytes(data))
        found = schema_of(conn)
        if found != seed.schema:
            extra = sorted({f"{t} {n}" for t, n, _, _ in set(found) - set(seed.schema)})
            missing = sorted({f"{t} {n}" for t, n, _, _ in set(seed.schema) - set(found)})
            raise ValueError(
                f"its schema is not the environment's (not in the seed, or changed: {extra}; missing or changed: {missing})"
            )
        problems = [r[0] for r in conn.execute("PRAGMA quick_check(5)").fetchall()]
        if problems != ["ok"]:
            raise ValueError(f"the database is damaged: {'; '.join(problems)}")
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"not a SQLite database ({exc})") from None
    finally:
        conn.close()


def like_pattern(text: str) -> str:
    """A LIKE pattern matching `text` anywhere, with `%`, `_` and `\\` taken literally.

    Use with `... LIKE ? ESCAPE '\\'`.

    >>> like_pattern("50%_off")
    '%50\\\\%\\\\_off%'
    """
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def changed_keys(before: sqlite3.Connection, after: sqlite3.Connection, table: str, key: str) -> set[Any]:
    """Keys of rows in `table` that were added, removed or altered between two databases.

    `table` and `key` come from environment code, never from a model (they are identifiers,
    which SQLite cannot bind as parameters); they are checked against the schema anyway.
    """
    _check_identifier(after, table, key)
    sql = f'SELECT * FROM "{table}" ORDER BY "{key}"'
    old = {row[key]: tuple(row) for row in _rows(before, sql)}
    new = {row[key]: tuple(row) for row in _rows(after, sql)}
    return {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}


def _rows(conn: sqlite3.Connection, sql: str) -> Iterable[sqlite3.Row]:
    cur = conn.cursor()
    cur.row_factory = sqlite3.Row
    return cur.execute(sql).fetchall()


def _check_identifier(conn: sqlite3.Connection, table: str, column: str) -> None:
    cols = [r[1] for r in conn.execute("SELECT * FROM pragma_table_info(?)", (table,)).fetchall()]
    if column not in cols:
        raise ValueError(f"no column {column!r} in table {table!r} (columns: {cols})")
