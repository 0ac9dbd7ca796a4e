"""Reading a judge's reply: find the judge's own verdict, check it against the request, compute totals.

Pure functions, no I/O, so every malformed or forged reply a judge can produce is a unit test. The
checks are strict because a silently wrong judgment is worse than a dropped one: a score mapped to
the wrong trajectory trains the policy toward the wrong output. Each problem is described in a
sentence the judge can act on, since the message is sent back verbatim in the one repair attempt.

The requested format puts a nonce first and the reason before the verdicts (field order in the
JSON), so the judge writes its reasoning before it commits to numbers:

    {"nonce": "3f0c9a1e", "scores": [{"id": "t1", "reason": "...", "criteria": {"correct": "yes"}}, ...]}

and, for a single output (absolute mode), `{"nonce": "...", "reason": "...", "criteria": {...}}`.

The judged outputs are written by a policy under pressure to please the judge, and a weak judge may
echo them back. `read_verdict` therefore takes JSON only from the judge's own part of a reply:

- a reply that repeats the request's `<response>` / `<context>` markers (any case) is refused;
- a JSON object that appears verbatim in a judged text is not the judge's, whatever it says;
- the verdict must carry the request's nonce, which the judged outputs never saw;
- of several objects carrying it, the last one is the verdict (an example comes before the answer);
- a key repeated inside the verdict is refused rather than resolved one way or the other.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from grooves.judge.errors import InvalidJudgment
from grooves.judge.prompt import MARKER
from grooves.judge.rubric import Rubric

_MAX_ERRORS = 6
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ItemVerdict:
    """The judge's verdict on one output: its reason, each criterion mapped to [0, 1], the weighted total."""

    reason: str
    criteria: dict[str, float]
    total: float


@dataclass(frozen=True)
class Seal:
    """What a reply to one request must carry (`nonce`) and must not be copied from (`judged`)."""

    nonce: str
    judged: tuple[str, ...] = ()
    """The context and responses exactly as the judge was shown them."""


def json_objects(text: str) -> list[tuple[int, int, dict[str, Any]]]:
    """Every top-level JSON object in `text`, as (start, end, value), left to right.

    >>> json_objects('x {"a": {"b": 1}} y {bad} {"c": 2}')
    [(2, 17, {'a': {'b': 1}}), (26, 34, {'c': 2})]
    """
    out: list[tuple[int, int, dict[str, Any]]] = []
    i = text.find("{")
    while i != -1:
        try:
            value, end = _DECODER.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        out.append((i, end, value))
        i = text.find("{", end)
    return out


class _RepeatedKey(ValueError):
    pass


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    repeated = next((k for k in keys if keys.count(k) > 1), None)
    if repeated is not None:
        raise _RepeatedKey(repeated)
    return dict(pairs)


def _snippet(text: str) -> str:
    return repr(text.strip().replace("\n", " ")[:80])


def read_verdict(text: str, seal: Seal) -> dict[str, Any]:
    """The judge's verdict object in `text`: sealed with `seal.nonce`, not copied from a judged text.

    Raises InvalidJudgment saying what was wrong (see the module docstring for the rules).

    >>> read_verdict('Example: {"nonce": "n1", "a": 0}. Mine: {"nonce": "n1", "a": 1}', Seal("n1"))
    {'nonce': 'n1', 'a': 1}
    """
    marker = MARKER.search(text)
    if marker is not None:
        raise InvalidJudgment(
            f"the reply repeats the request's blocks ({marker.group(0)!r}...); reply with only your own JSON verdict"
        )
    objects = json_objects(text)
    if not objects:
        raise InvalidJudgment(
            f"the reply is not valid JSON (no JSON object found): {_snippet(text) if text.strip() else 'empty reply'}"
        )
    judged = [t for t in seal.judged if t.strip()]
    own = [(s, e, v) for s, e, v in objects if not any(text[s:e] in t for t in judged)]
    if not own:
        raise InvalidJudgment(
            "the only JSON in the reply is copied from the responses being judged; write your own verdict"
        )
    sealed = [(s, e, v) for s, e, v in own if v.get("nonce") == seal.nonce]
    if not sealed:
        found = [v["nonce"] for _, _, v in own if "nonce" in v]
        got = f"; it has {found[-1]!r}" if found else ""
        raise InvalidJudgment(f'the verdict must start with "nonce": "{seal.nonce}" as instructed{got}')
    start, end, _ = sealed[-1]
    try:
        return json.loads(text[start:end], object_pairs_hook=_no_repeats)
    except _RepeatedKey as exc:
        raise InvalidJudgment(f'the verdict repeats the key "{exc}"; give each key once') from None


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
        return errors + [
            f'{where} needs a "criteria" object with keys {", ".join(c.name for c in rubric.criteria)}'
        ], None
    known = {c.name for c in rubric.criteria}
    errors += [
        f'{where}: unknown criterion "{k}" (allowed: {", ".join(sorted(known))})'
        for k in crits
        if k not in known
    ]
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


def parse_group(text: str, ids: list[str], rubric: Rubric, seal: Seal) -> dict[str, ItemVerdict]:
    """Validate a group reply: exactly one score per id in `ids`, each valid under `rubric`.

    Raises InvalidJudgment listing every problem (no sealed verdict, see `read_verdict`; no
    "scores" list, wrong count, a missing, unknown or repeated id, a missing reason, a missing or
    unknown criterion, a value out of range or not among the choices).
    """
    data = read_verdict(text, seal)
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


def parse_single(text: str, rubric: Rubric, seal: Seal) -> ItemVerdict:
    """Validate an absolute-mode reply {"nonce": ..., "reason": ..., "criteria": {...}} for one output."""
    data = read_verdict(text, seal)
    errors, verdict = _item_errors(data, "the reply", rubric)
    if errors or verdict is None:
        _raise(errors)
    assert verdict is not None
    return verdict
