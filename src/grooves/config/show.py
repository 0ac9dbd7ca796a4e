"""A resolved run file as TOML with every field, each under its one-line doc (`grooves config show`).

What the file set and what it left to the defaults look alike: the point is to see the whole run.
A field without a value (an unset option) is written as a comment, `# init_adapter = (unset)`, so
the text stays a valid run file that loads back to the same config.
"""

from __future__ import annotations

import json
import math
from typing import Any, get_origin

from pydantic import BaseModel


def one_line(doc: str | None) -> str:
    """A field's docstring (its first paragraph) on one line.

    >>> one_line("Rollouts per scenario. Advantages are\\n    relative to the group.\\n\\nMore.")
    'Rollouts per scenario. Advantages are relative to the group.'
    """
    if not doc:
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def toml_value(value: Any) -> str:
    """One value in TOML syntax (inline tables and arrays for nested data).

    >>> toml_value({"max_turns": 6, "name": "a"}), toml_value([1, 2.5, True]), toml_value(2e-4)
    ('{max_turns = 6, name = "a"}', '[1, 2.5, true]', '0.0002')
    """
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return (
            repr(value)
            if math.isfinite(value)
            else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
        )
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        items = ", ".join(f"{_key(k)} = {toml_value(v)}" for k, v in value.items() if v is not None)
        return "{" + items + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def _key(name: str) -> str:
    return name if name.replace("_", "").replace("-", "").isalnum() else json.dumps(name)


def annotated_toml(config: BaseModel) -> str:
    """`config` with every field: scalars first, then one `[table]` per section (nested sections
    as `[section.sub]`), each field under `# its doc`. Unset optional sections are commented out."""
    lines: list[str] = []
    _emit(config, [], lines)
    return "\n".join(lines).strip() + "\n"


def _emit(model: BaseModel, path: list[str], lines: list[str]) -> None:
    fields = type(model).model_fields
    tables: list[tuple[str, BaseModel | None, str]] = []
    for name, info in fields.items():
        value = getattr(model, name)
        doc = one_line(info.description)
        if isinstance(value, BaseModel):
            tables.append((name, value, doc))
            continue
        if value is None and _is_section(info.annotation):
            tables.append((name, None, doc))
            continue
        if doc:
            lines.append(f"# {doc}")
        if value is None:
            lines.append(f"# {name} = (unset)")
        else:
            lines.append(f"{_key(name)} = {toml_value(value)}")
    for name, value, doc in tables:
        header = ".".join([*path, name])
        lines.append("")
        if doc:
            lines.append(f"# {doc}")
        if value is None:
            lines.append(f"# [{header}] (unset)")
            continue
        section_doc = one_line(type(value).__doc__) if type(value).__doc__ != BaseModel.__doc__ else ""
        if section_doc and section_doc != doc:
            lines.append(f"# {section_doc}")
        lines.append(f"[{header}]")
        _emit(value, [*path, name], lines)


def _is_section(annotation: Any) -> bool:
    """True for `SomeSection | None`: an optional table of the run file."""
    args = getattr(annotation, "__args__", ())
    return any(isinstance(a, type) and get_origin(a) is None and issubclass(a, BaseModel) for a in args)
