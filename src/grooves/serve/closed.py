"""Request objects closed at every depth: a key the server does not read is a 400 naming its path.

The top-level fields of each API are checked against their tables (`serve.compat`,
`serve.responses.fields`); the objects inside them (messages, their parts and tool calls, tools,
`tool_choice`, formats, Responses items) are `Closed` pydantic models, which refuse any key they
do not declare (`extra="forbid"`), so a request is never answered as if a nested field it sent had
been honoured. A key the server knows but does not implement is declared with `refused(note,
*inert)`: accepted at a value that asks for nothing (null, false), a 400 otherwise, as a refused
top-level field is. An object whose shape depends on its `type` (an input item, a format) is
checked by `one_of`, which picks the model its `type` names.

The server reads most of these objects as plain dicts (the chat template, the grammars, the tool
parser take dicts), so a `Closed` model here is a check: `shaped` and `one_of` validate the dict
and keep it as it came. `request_error` turns pydantic's first error into the 400, its `param` the
path as OpenAI writes it (`tools[0].defer_loading`, `messages[1].tool_calls[0].function.name`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from grooves.serve.errors import APIError

REFUSED = "refused"
"""The pydantic error type of a value refused here; its message follows the field's path."""


class Closed(BaseModel):
    """An object inside a request: a key it does not declare is refused."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def refusal(message: str) -> PydanticCustomError:
    """The error of a refused value: `message` reads after the path ("is not supported ...")."""
    return PydanticCustomError(REFUSED, message)


def refused_at(loc: tuple[str | int, ...], message: str, value: Any) -> ValidationError:
    """A refusal at `loc` inside the object being validated (raised from a validator, pydantic
    puts the object's own path before it)."""
    return ValidationError.from_exception_data(
        "request", [InitErrorDetails(type=refusal(message), loc=loc, input=value)]
    )


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b  # `0 == False`, but 0 is no answer to a boolean


def refused(note: str, *inert: Any) -> AfterValidator:
    """A field the server knows and does not implement: null or one of `inert` (values that ask for
    nothing) passes; any other value is refused, with `note` saying why."""
    allowed = (None, *inert)

    def check(value: Any) -> Any:
        if not any(_same(value, a) for a in allowed):
            raise refusal(f"is not supported by this server ({note}); remove it")
        return value

    return AfterValidator(check)


def shaped(model: type[BaseModel]) -> AfterValidator:
    """A dict checked against `model` and kept as the dict it came as."""

    def check(value: dict[str, Any]) -> dict[str, Any]:
        model.model_validate(value)
        return value

    return AfterValidator(check)


def one_of(
    models: Mapping[str, type[BaseModel]],
    unknown: Callable[[Any], str],
    kind: Callable[[dict[str, Any]], Any] = lambda item: item.get("type"),
) -> AfterValidator:
    """A dict checked against the model its `kind` (by default its `type`) names, and kept as it came;
    another kind is refused at `type` with `unknown(kind)`."""

    def check(value: dict[str, Any]) -> dict[str, Any]:
        name = kind(value)
        model = models.get(name) if isinstance(name, str) else None
        if model is None:
            raise refused_at(("type",), unknown(name), name)
        model.model_validate(value)
        return value

    return AfterValidator(check)


def param_path(loc: Sequence[str | int]) -> str:
    """A pydantic error's location as OpenAI names a field.

    >>> param_path(("messages", 1, "tool_calls", 0, "function", "name"))
    'messages[1].tool_calls[0].function.name'
    """
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def request_error(exc: ValidationError) -> APIError:
    """The 400 of a request that failed validation: its first error, naming the field's path."""
    first = exc.errors(include_url=False)[0]
    param = param_path(first["loc"])
    if first["type"] == "extra_forbidden":
        message = f"{param} is not a field this server knows; remove it"
    elif first["type"] == REFUSED:
        message = f"{param} {first['msg']}"
    else:
        message = f"{param}: {first['msg']}" if param else first["msg"]
    return APIError(400, message, param or None)
