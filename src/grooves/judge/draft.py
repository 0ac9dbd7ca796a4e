"""Reading a rubric that a model drafted: the TOML (or JSON) it wrote, tidied, then checked by the loader's rules.

A model asked for a rubric often wraps the TOML in a code fence, puts a sentence before or after
it, writes `[criteria.correct]` tables instead of `[[criteria]]`, or gives a criterion a name
with spaces. Those are repaired here, without asking again. The rubric's `name` and `version` are
grooves' to set (from the file it is written to; the person bumps the version), so whatever the
model put there is replaced. Anything else (a reply that holds no TOML or JSON, a missing
`text`, a weight of 0, repeated names, an unknown field) raises `InvalidDraft`, whose message is
what the model is shown when it is asked, once, to repair its draft.

The checks are `rubric.rubric_from_data`'s, the same as `load_rubric`'s, so a draft that passes
here loads from the file it is written to.
"""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any

from grooves.judge.rubric import Rubric, RubricError, rubric_from_data

_FENCE = re.compile(r"```[\w-]*[ \t]*\n(.*?)```", re.DOTALL)
_TOML_LINE = re.compile(r"^\s*(\[\[?\s*[\w.\"-]+\s*\]\]?\s*$|[\w\"-]+\s*=)")
"""A line that starts a TOML table or a key: where the rubric in a reply with prose around it begins and ends."""


class InvalidDraft(ValueError):
    """A drafted rubric that cannot be used; the message says what is wrong, in words a model can act on."""


def _toml_span(reply: str) -> str:
    """The lines from the first TOML-looking line to the last one (prose before and after dropped)."""
    lines = reply.splitlines()
    marks = [i for i, line in enumerate(lines) if _TOML_LINE.match(line)]
    return "\n".join(lines[marks[0] : marks[-1] + 1]) if marks else ""


def _candidates(reply: str) -> list[str]:
    """Texts that may hold the rubric, most likely first: fenced blocks, the reply, its TOML-looking span."""
    return [*_FENCE.findall(reply), reply, _toml_span(reply)]


def _from_toml(reply: str) -> tuple[dict[str, Any] | None, str]:
    """The first parsed candidate that has criteria (else the first that parses), and the first TOML error."""
    parsed: dict[str, Any] | None = None
    problem = ""
    for text in _candidates(reply):
        if not text.strip():
            continue
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            problem = problem or f"the reply is not valid TOML: {exc}"
            continue
        if "criteria" in data:
            return data, ""
        parsed = parsed if parsed is not None else data
    return parsed, problem


def _from_json(reply: str) -> dict[str, Any] | None:
    """The first JSON object in the reply that has criteria (models that prefer JSON write that)."""
    decoder = json.JSONDecoder()
    for start in (m.start() for m in re.finditer(r"\{", reply)):
        try:
            data, _ = decoder.raw_decode(reply, start)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and "criteria" in data:
            return data
    return None


def _key(name: object) -> object:
    """A criterion name as a key: runs of other characters become `_` ("Factual accuracy" -> "Factual_accuracy").

    >>> _key("Factual accuracy!"), _key("no-invention")
    ('Factual_accuracy', 'no-invention')
    """
    if not isinstance(name, str):
        return name
    return re.sub(r"[^\w-]+", "_", name).strip("_") or name


def _tidy(data: dict[str, Any], name: str, version: str) -> dict[str, Any]:
    data = {**data, "name": name, "version": version}
    if "criteria" not in data:
        return data
    criteria = data["criteria"]
    if isinstance(criteria, dict):  # [criteria.correct] tables: the key is the name
        if all(isinstance(v, dict) for v in criteria.values()):
            criteria = [{"name": k, **v} for k, v in criteria.items()]
        else:  # a single [criteria] table
            criteria = [criteria]
    if isinstance(criteria, list):
        criteria = [
            {**c, "name": _key(c["name"])} if isinstance(c, dict) and "name" in c else c for c in criteria
        ]
    data["criteria"] = criteria
    return data


def parse_draft(reply: str, name: str, version: str = "1") -> Rubric:
    """The rubric a model's reply holds, named `name` at `version`; `InvalidDraft` says why there is none.

    >>> r = parse_draft('Here it is:\\n[[criteria]]\\nname = "on topic"\\ntext = "Is it on topic?"\\nThanks!', "qa")
    >>> r.tag.split("#")[0], r.criteria[0].name
    ('qa@1', 'on_topic')
    """
    if not reply.strip():
        raise InvalidDraft("the reply is empty; reply with the rubric as TOML")
    data, problem = _from_toml(reply)
    if data is None or "criteria" not in data:
        data = _from_json(reply) or data
    if data is None and not _toml_span(reply):
        raise InvalidDraft(
            "the reply holds no TOML (no `key = value` line, no [[criteria]] table); reply with the rubric as TOML"
        )
    if data is None:
        raise InvalidDraft(problem)
    try:
        return rubric_from_data(_tidy(data, name, version), "the draft")
    except RubricError as exc:
        raise InvalidDraft(str(exc)) from exc
