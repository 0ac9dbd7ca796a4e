"""JSONL files of pydantic records: the one reader and writer behind every record file.

Trajectories, scores, verdicts, findings and stories are all one JSON object per line. A line that
does not parse is an error naming the file and the line, never a silently dropped record. Plain
rows (metrics, watch statistics) have their own pair, `read_jsonl` / `write_jsonl`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def write_models(path: str | Path, records: Iterable[BaseModel], *, append: bool) -> Path:
    """Write records one per line; `append` adds to the file, otherwise it is replaced."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w", encoding="utf-8") as f:
        for record in records:
            f.write(record.model_dump_json() + "\n")
    return path


def read_models(path: str | Path, model: type[M], *, what: str, missing_ok: bool = False) -> list[M]:
    """Read records of `model`; a bad line raises ValueError("FILE:LINE: not a WHAT: ...")."""
    path = Path(path)
    if missing_ok and not path.exists():
        return []
    out: list[M] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                out.append(model.model_validate_json(line))
            except ValidationError as exc:
                raise ValueError(f"{path}:{lineno}: not {what}: {exc.errors()[0]['msg']}") from exc
    return out


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """JSON objects, one per line; a truncated final line (what a killed writer leaves) is dropped.

    A bad line before the last is an error naming the file and the line: something else wrote there.
    """
    path = Path(path)
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    rows = []
    for number, line in enumerate(lines, start=1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number} is not JSON ({exc.msg}); the file is corrupt") from exc
    return rows


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Replace `path` with `rows`, one JSON object per line."""
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
