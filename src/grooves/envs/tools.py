"""Tools an agent may call: declared with a JSON schema, validated, and never fatal.

A tool is a plain function over the episode's state and its validated arguments. The toolbox
stands between it and the model: it refuses oversized arguments before parsing them, parses the
JSON, validates it with `jsonschema`, and turns every failure (unknown tool, bad JSON, schema
violation, a refusal, even a bug in the tool) into a tool message the agent can read and react
to. A bad call is data about the agent, not a reason to lose the rollout.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from grooves.envs.base import Limits, Scenario, ToolCall
from grooves.envs.state import SeedDatabase, SqliteState

_MAX_ERROR_CHARS = 300
"""Error texts can quote the offending value (a 1 MB string); keep them short."""


class ToolError(Exception):
    """A refusal the agent should read: not found, not allowed by policy, wrong state."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool may touch: this episode's state, its scenario, and the untouched seed."""

    state: SqliteState
    scenario: Scenario
    seed: SeedDatabase
    call_index: int
    """How many tool calls came before this one; with the scenario id it seeds any noise, so a
    restored or forked episode replays the same noise."""

    def rng(self, salt: str = "") -> random.Random:
        return random.Random(f"{self.scenario.get('id')}:{self.call_index}:{salt}")


ToolFn = Callable[[ToolContext, dict[str, Any]], Any]


@dataclass(frozen=True)
class Tool:
    """A function with its OpenAI-format declaration and its cost in simulated seconds."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: ToolFn
    latency_s: float = 0.2

    def spec(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolOutcome:
    """A tool message's content, and the error kind when the call failed (for metrics)."""

    content: str
    error: str | None = None
    latency_s: float = 0.0


def error_content(kind: str, message: str) -> str:
    """A tool error as the agent sees it; long messages keep their head and tail (the reason)."""
    if len(message) > _MAX_ERROR_CHARS:
        message = message[: _MAX_ERROR_CHARS - 100] + " ... " + message[-95:]
    return json.dumps({"error": kind, "message": message})


def parse_arguments(text: str) -> tuple[dict[str, Any], tuple[str, str] | None]:
    """A tool call's JSON arguments as a dict, or ({}, (error kind, message)); never raises.

    >>> parse_arguments('{"key": 1}')
    ({'key': 1}, None)
    >>> parse_arguments("[" * 4000 + "]" * 4000)[1]
    ('invalid_json', 'arguments are nested too deeply to parse')
    """
    try:
        args = json.loads(text.strip() or "{}")
    except json.JSONDecodeError as exc:
        return {}, ("invalid_json", f"arguments are not valid JSON ({exc.msg} at character {exc.pos})")
    except RecursionError:
        return {}, ("invalid_json", "arguments are nested too deeply to parse")
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        return {}, ("invalid_json", f"arguments are not valid JSON ({exc})")
    if not isinstance(args, dict):
        return {}, ("invalid_arguments", f"arguments must be a JSON object, got {type(args).__name__}")
    return args, None


class ToolBox:
    """The environment's tools behind one guarded entry point, `run`."""

    def __init__(self, tools: Sequence[Tool], limits: Limits):
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        for tool in tools:
            Draft202012Validator.check_schema(tool.parameters)  # an environment bug: fail at import
        self._tools = {t.name: t for t in tools}
        self._validators = {t.name: Draft202012Validator(t.parameters) for t in tools}
        self.limits = limits

    @property
    def specs(self) -> list[dict[str, Any]]:
        return [t.spec() for t in self._tools.values()]

    def latency(self, name: str) -> float:
        tool = self._tools.get(name)
        return tool.latency_s if tool is not None else 0.0

    def run(self, ctx: ToolContext, call: ToolCall) -> ToolOutcome:
        """The call's outcome; never raises, whatever the call holds (a failure is an error outcome)."""
        try:
            return self._run(ctx, call)
        except Exception as exc:  # a gap in the guards below: still an error outcome, not a server error
            with contextlib.suppress(
                Exception
            ):  # the connection may be unusable; the outcome says what failed
                ctx.state.conn.rollback()
            text = f"{call.name!r} could not be run: {type(exc).__name__}: {exc}"
            return ToolOutcome(error_content("tool_crashed", text), "tool_crashed", self.latency(call.name))

    def _run(self, ctx: ToolContext, call: ToolCall) -> ToolOutcome:
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self._tools))
            return ToolOutcome(
                error_content("unknown_tool", f"no tool {call.name!r}; tools: {known}"), "unknown_tool"
            )
        args, problem = self._parse(call)
        if problem is not None:
            return ToolOutcome(error_content(*problem), problem[0], tool.latency_s)
        try:
            result = tool.fn(ctx, args)
        except ToolError as exc:
            ctx.state.conn.rollback()
            return ToolOutcome(error_content("refused", str(exc)), "refused", tool.latency_s)
        except Exception as exc:  # a bug in one tool must not end the rollout or the server
            ctx.state.conn.rollback()
            text = f"{call.name} failed: {type(exc).__name__}: {exc}"
            return ToolOutcome(error_content("tool_crashed", text), "tool_crashed", tool.latency_s)
        try:
            content = json.dumps(result, ensure_ascii=False, default=str)
        except (ValueError, RecursionError) as exc:  # a result JSON cannot hold (a circular or huge value)
            text = (
                f"{call.name} returned a result that cannot be written as JSON: {type(exc).__name__}: {exc}"
            )
            return ToolOutcome(error_content("tool_crashed", text), "tool_crashed", tool.latency_s)
        return ToolOutcome(_clip(content, self.limits.max_result_chars), None, tool.latency_s)

    def _parse(self, call: ToolCall) -> tuple[dict[str, Any], tuple[str, str] | None]:
        limit = self.limits.max_argument_chars
        if len(call.arguments) > limit:
            return {}, (
                "arguments_too_large",
                f"arguments are {len(call.arguments)} characters; the limit is {limit}",
            )
        args, problem = parse_arguments(call.arguments)
        if problem is not None:
            return {}, problem
        try:
            error = best_match(self._validators[call.name].iter_errors(args))
        except RecursionError:
            return {}, ("invalid_arguments", "arguments are nested too deeply to check")
        if error is not None:
            return {}, ("schema_violation", f"at {error.json_path}: {error.message}")
        return args, None


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"...[truncated {len(text) - limit} characters]"


def obj(properties: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    """A closed JSON-schema object: unknown fields are a schema violation, not silently dropped."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def string(description: str, max_length: int = 200, enum: Sequence[str] | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "description": description, "maxLength": max_length}
    if enum is not None:
        schema["enum"] = list(enum)
    return schema


def integer(description: str, minimum: int | None = None, maximum: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer", "description": description}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema
