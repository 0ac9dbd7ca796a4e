"""The config system every run file uses (RL runs, SFT runs): sections, parsing, error lines.

A section is a pydantic model that refuses unknown fields, inf and nan, and re-validates on
assignment; a field's docstring says what it trades off. A file is read with `read_run_file`
(TOML, `--set` overrides applied) and validated with `validate`: a wrong type, an impossible
value or an unknown field is one line naming the field, the value and what is allowed
(`ConfigError`), and `check_numbers` refuses inf, nan and true/false-for-a-number in every section
at once. A new section is a new `Section` subclass in a module of its own, added as a field of the
run file's top-level model.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)


class Section(BaseModel):
    """One table of a run file."""

    # inf and nan are refused here, and by `check_numbers` wherever a union type lets them pass
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, allow_inf_nan=False, use_attribute_docstrings=True
    )


class ConfigError(ValueError):
    """A run file that cannot be used; the message is one line per problem, naming the field."""


def format_errors(exc: ValidationError, retired: Mapping[str, str] | None = None) -> str:
    """pydantic's errors as one line each, naming the field; `retired` maps a field that was
    replaced (dotted, e.g. `model.fused_decode`) to what replaces it."""
    retired = retired or {}
    lines = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden" and field in retired:
            lines.append(f"{field}: {retired[field]}")
        elif err["type"] == "extra_forbidden":
            lines.append(f"{field}: unknown field; check its spelling and section")
        elif not field:  # a check across fields: its message names them
            lines.append(message)
        else:
            lines.append(f"{field}: {message} (got {err.get('input')!r})")
    return "\n".join(lines)


def check_numbers(raw: Any, value: Any, field: str = "") -> list[str]:
    """Problems with the numbers of a validated config `value` read from `raw` (the parsed TOML),
    one line each naming the field: inf or nan anywhere (TOML writes them `inf`, `nan`), and
    true/false where a number is wanted (pydantic would read them as 1 and 0: `steps = true`).

    Applies to every section, the watch's and task options included, so no float field needs its
    own check."""
    if isinstance(raw, bool) and isinstance(value, int | float) and not isinstance(value, bool):
        return [f"{field}: Input should be a number, not {str(raw).lower()} (got {raw!r})"]
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{field}: Input should be a finite number (got {value!r})"]
    prefix = f"{field}." if field else ""
    if isinstance(value, BaseModel):
        raw_of = raw.get if isinstance(raw, dict) else (lambda name: getattr(raw, name, None))
        return [
            p
            for name in type(value).model_fields
            for p in check_numbers(raw_of(name), getattr(value, name), prefix + name)
        ]
    if isinstance(value, dict):
        raw = raw if isinstance(raw, dict) else {}
        return [p for key, v in value.items() for p in check_numbers(raw.get(key), v, f"{prefix}{key}")]
    if isinstance(value, list | tuple):
        raw = raw if isinstance(raw, list | tuple) and len(raw) == len(value) else [None] * len(value)
        return [
            p
            for i, (r, v) in enumerate(zip(raw, value, strict=True))
            for p in check_numbers(r, v, f"{prefix}{i}")
        ]
    return []


def validate(model: type[M], data: dict, *, retired: Mapping[str, str] | None = None) -> M:
    """`data` (a parsed run file) as `model`, or `ConfigError` with one line per problem."""
    try:
        config = model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, retired)) from None
    problems = check_numbers(data, config)
    if problems:
        raise ConfigError("\n".join(problems))
    return config


def read_run_file(path: str | Path | None, overrides: dict | None = None) -> dict:
    """A run file's tables (none when `path` is None), with `overrides` (dotted keys) winning."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such run file") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    for key, value in (overrides or {}).items():
        set_nested(data, key.split("."), value)
    return data


def parse_overrides(items: list[str]) -> dict:
    """`--set key=value` options as a dict; values are read as TOML (numbers, booleans, lists), else kept as text."""
    overrides: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set optim.lr=1e-4")
        try:
            overrides[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            overrides[key] = value
    return overrides


def set_nested(data: dict, keys: list[str], value) -> None:
    """`data[keys[0]][keys[1]]... = value`, creating the tables on the way."""
    for k in keys[:-1]:
        data = data.setdefault(k, {})
    data[keys[-1]] = value


def dump(config: BaseModel) -> str:
    """A validated config as TOML (all fields, defaults included)."""
    import tomli_w

    return tomli_w.dumps(config.model_dump(mode="json", exclude_none=True))
