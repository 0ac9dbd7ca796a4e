"""Reading a judge's reply: extract the JSON, check it against the request, compute totals.

Pure functions, no I/O, so every malformed reply a judge can produce is a unit test. The checks are
strict because a silently wrong judgment is worse than a dropped one: a score mapped to the wrong
trajectory trains the policy toward the wrong output. Each problem is described in a sentence the
judge can act on, since the message is sent back verbatim in the one repair attempt.

The requested format puts the reason before the verdicts (field order in the JSON), so the judge
writes its reasoning before it commits to numbers:

    {"scores": [{"id": "t1", "reason": "...", "criteria": {"correct": "yes", "concise": 0.5}}, ...]}

and, for a single output (absolute mode), `{"reason": "...", "criteria": {...}}`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from grooves.judge.errors import InvalidJudgment
from grooves.judge.rubric import Rubric

_FENCE = re.compile(r"```(?:json|JSON)?\s*\n?(.*?)```", re.DOTALL)
_MAX_ERRORS = 6


@dataclass(frozen=True)
class ItemVerdict:
    """The judge's verdict on one output: its reason, each criterion mapped to [0, 1], the weighted total."""

    reason: str
    criteria: dict[str, float]
    total: float


def extract_json(text: str) -> Any:
    """Parse the JSON in a reply, tolerating code fences and prose around one object.

    >>> extract_json('Here you go:\\n```json\\n{"a": 1}\\n```')
    {'a': 1}
    """
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    first_error = ""
    for candidate in candidates:
        try:
            return json.loads(candidate.strip())
        except json.JSONDecodeError as exc:
            first_error = first_error or str(exc)
    snippet = text.strip().replace("\n", " ")[:80]
    raise InvalidJudgment(f"the reply is not valid JSON ({first_error or 'empty reply'}): {snippet!r}")


def _item_errors(item: Any, where: str, rubric: Rubric) -> tuple[list[str], ItemVerdict | None]:
    """Check one {"reason", "criteria"} object; return its errors, or its verdict when it has none."""
    if not isinstance(item, dict):
        return [f"{where} must be a JSON object, got {type(item).__name__}"], None
    errors: list[str] = []
    reason = item.get("reason")
    if not isinstance(reason, str):
        errors.append(f'{where} needs a "reason" string before its criteria')
    crits = item.get("criteria")
    if not isinstance(crits, dict):
        return errors + [f'{where} needs a "criteria" object with keys {", ".join(c.name for c in rubric.criteria)}'], None
    known = {c.name for c in rubric.criteria}
    errors += [f'{where}: unknown criterion "{k}" (allowed: {", ".join(sorted(known))})' for k in crits if k not in known]
    values: dict[str, float] = {}
    for c in rubric.criteria:
        if c.name not in crits:
            errors.append(f'{where}: missing criterion "{c.name}" ({c.scale()})')
            continue
        try:
            values[c.name] = c.value_of(crits[c.name])
        except ValueError as exc:
            errors.append(f"{where}: {exc}")
    if errors:
        return errors, None
    return [], ItemVerdict(reason=str(reason).strip(), criteria=values, total=rubric.total(values))


def _raise(errors: list[str]) -> None:
    shown = errors[:_MAX_ERRORS]
    more = f" (and {len(errors) - len(shown)} more)" if len(errors) > len(shown) else ""
    raise InvalidJudgment("; ".join(shown) + more)


def parse_group(text: str, ids: list[str], rubric: Rubric) -> dict[str, ItemVerdict]:
    """Validate a group reply: exactly one score per id in `ids`, each valid under `rubric`.

    Raises InvalidJudgment listing every problem (not JSON, no "scores" list, wrong count, a
    missing, unknown or repeated id, a missing reason, a missing or unknown criterion, a value
    out of range or not among the choices).
    """
    data = extract_json(text)
    scores = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(scores, list):
        raise InvalidJudgment('the reply must be a JSON object {"scores": [...]} with one entry per id')
    errors: list[str] = []
    if len(scores) != len(ids):
        errors.append(f"expected exactly {len(ids)} scores (ids {', '.join(ids)}), got {len(scores)}")
    verdicts: dict[str, ItemVerdict] = {}
    seen: set[str] = set()
    for i, item in enumerate(scores):
        sid = item.get("id") if isinstance(item, dict) else None
        where = f"scores[{i}]" + (f" (id {sid})" if isinstance(sid, str) else "")
        if not isinstance(sid, str):
            errors.append(f'scores[{i}] has no "id" string; use one of {", ".join(ids)}')
        elif sid not in ids:
            errors.append(f'scores[{i}] has id "{sid}", which is not one of {", ".join(ids)}')
        elif sid in seen:
            errors.append(f'id "{sid}" is scored more than once')
        item_errors, verdict = _item_errors(item, where, rubric)
        errors += item_errors
        if isinstance(sid, str) and sid in ids and sid not in seen and verdict is not None:
            verdicts[sid] = verdict
        if isinstance(sid, str):
            seen.add(sid)
    errors += [f'no score for id "{i}"' for i in ids if i not in seen]
    if errors:
        _raise(errors)
    return verdicts


def parse_single(text: str, rubric: Rubric) -> ItemVerdict:
    """Validate an absolute-mode reply {"reason": ..., "criteria": {...}} for one output."""
    data = extract_json(text)
    errors, verdict = _item_errors(data, "the reply", rubric)
    if errors or verdict is None:
        _raise(errors)
    assert verdict is not None
    return verdict
