"""Training on an MCP server's tools: the notes server (server.py) with scenarios and a grader.

    grooves train examples/mcp_notes/run.toml

The server supplies the tools; this task supplies what the model should do (scenarios) and how
to score it (the grader asks the episode's own server which notes it ended with).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grooves import EnvironmentTask
from grooves.envs import Grade, McpEnvironment, McpGradeInput, McpServer

SERVER = McpServer(command=(sys.executable, str(Path(__file__).with_name("server.py"))))
THINGS = ["buy milk", "call Ana at 5", "water the plants", "book the dentist", "pay rent", "send the report"]


def scenarios(split: str) -> list[dict]:
    picked = THINGS[:4] if split == "train" else THINGS[4:]
    return [
        {"id": f"{split}-{i}", "split": split, "prompt": f"Save a note that says: {text}", "expected": text}
        for i, text in enumerate(picked)
    ]


def grade(g: McpGradeInput) -> Grade:
    """1.0 when the server holds exactly the expected note; 0.5 when it holds it among others."""
    try:
        notes = json.loads(g.call("list_notes", {}))
    except json.JSONDecodeError:
        notes = []
    saved = g.scenario["expected"] in notes
    score = 1.0 if notes == [g.scenario["expected"]] else 0.5 if saved else 0.0
    return Grade(
        score=score, parts={"saved": float(saved)}, notes=[] if saved else ["the note was not saved"]
    )


def gold(scenario: dict, call) -> str:
    call("add_note", {"text": scenario["expected"]})
    return "Saved."


def make_env(server: McpServer = SERVER) -> McpEnvironment:
    return McpEnvironment(
        server,
        name="mcp_notes",
        scenarios_by_split={s: scenarios(s) for s in ("train", "validation")},
        grade=grade,
        gold=gold,
        system_prompt="You save notes with the add_note tool, then answer in one short sentence.",
    )


def make_task(max_turns: int = 3) -> EnvironmentTask:
    return EnvironmentTask(make_env(), max_turns=max_turns)
