"""Time per episode reset for each built-in environment: backup API vs re-running the inserts.

A reset copies the environment's seed database into a fresh in-memory connection. This script
times, per environment and over `--resets` resets each:

- `env.reset`: the real path (SQLite backup API + episode object), closed after each;
- `deserialize`: a fresh connection loaded from the seed's `serialize()` bytes (the snapshot path);
- `replay inserts`: a fresh connection re-running every SQL statement the seed builder ran
  (schema and each INSERT with its values inlined, in one transaction), captured with a trace
  callback: the cost of rebuilding the state without any of the Python data generation.

Run: .venv/bin/python benchmarks/bench_env_reset.py [--resets 1000]
"""

from __future__ import annotations

import argparse
import sqlite3
import time

from rich.console import Console
from rich.table import Table

from grooves.envs import BUILTINS, get_env
from grooves.envs.state import connect


def per_call_us(fn, n: int) -> float:
    fn()  # warm caches and lazy imports
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def replayable_sql(env) -> str:
    """The builder's statements as one script (SQLite's internal FTS statements, logged as
    `--` comments, and Python's transaction statements are left out)."""
    log: list[str] = []
    conn = sqlite3.connect(":memory:")
    conn.set_trace_callback(log.append)
    env.spec.build_seed(conn, env.data_seed)
    conn.close()
    body = [s.strip().rstrip(";") for s in log if not s.lstrip().startswith(("--", "BEGIN", "COMMIT"))]
    return "BEGIN;\n" + ";\n".join(body) + ";\nCOMMIT;"


def bench(name: str, resets: int) -> dict[str, float]:
    env = get_env(name)
    scenario = env.scenarios("train")[0]
    seed = env.seed_db.connection
    image = env.seed_db.serialize()
    dump = replayable_sql(env)
    rows = sum(
        seed.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
        for (t,) in seed.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE 'CREATE VIRTUAL%' "
            "AND name NOT LIKE '%fts_%'"
        )
    )

    def via_reset() -> None:
        env.reset(scenario).close()

    def via_deserialize() -> None:
        conn = connect()
        conn.deserialize(image)
        conn.close()

    def via_inserts() -> None:
        conn = sqlite3.connect(":memory:")
        conn.executescript(dump)
        conn.close()

    return {
        "kib": len(image) / 1024,
        "rows": rows,
        "reset": per_call_us(via_reset, resets),
        "deserialize": per_call_us(via_deserialize, resets),
        "inserts": per_call_us(via_inserts, resets),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resets", type=int, default=1000, help="resets timed per method and environment")
    args = parser.parse_args()
    table = Table(title=f"time per reset, mean of {args.resets} (us)")
    for column in (
        "environment",
        "db KiB",
        "rows",
        "env.reset (backup)",
        "deserialize",
        "replay inserts",
        "inserts / backup",
    ):
        table.add_column(column, justify="left" if column == "environment" else "right")
    for name in BUILTINS:
        r = bench(name, args.resets)
        table.add_row(
            name,
            f"{r['kib']:.0f}",
            str(r["rows"]),
            f"{r['reset']:.0f}",
            f"{r['deserialize']:.0f}",
            f"{r['inserts']:.0f}",
            f"{r['inserts'] / r['reset']:.1f}x",
        )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
