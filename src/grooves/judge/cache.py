"""A persistent on-disk cache of judgments, in one SQLite file.

Judging is the slow and costly part of the calibration loop, and a person re-runs the same batch
many times while editing only the report or one criterion. Keys are sha256 hashes of (judge model,
rubric hash, the exact request), so any change to any of them misses the cache, and identical
requests are answered without a call. Only judgments that passed validation are stored: a judge
glitch is never replayed forever.

SQLite (WAL mode) is used rather than a directory of files because several processes (a training
run and a `grooves judge score` next to it) may share one cache safely.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path


def cache_key(*parts: object) -> str:
    """sha256 hex of the canonical JSON of `parts` (order matters, dict key order does not)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class JudgeCache:
    """Key -> text store backed by SQLite; safe to share between processes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, timeout=30.0)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS judgments (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL)"
        )
        self._conn.commit()

    def get(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM judgments WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def put(self, key: str, value: str) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO judgments (key, value, created) VALUES (?, ?, ?)",
            (key, value, time.time()),
        )
        self._conn.commit()

    def __len__(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM judgments").fetchone()[0])

    def close(self) -> None:
        self._conn.close()
