"""A finding: one thing the watch saw, at one step, with the numbers that made it fire.

Findings are the watch's only output besides its per-step statistics. They are plain records
(JSONL in `findings.jsonl`, rows in the report, marks on the curves), so the evidence holds
numbers and short strings only, never whole trajectories.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from grooves.config.watch import Severity
from grooves.jsonl import read_models, write_models

SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "critical": 2}


class Finding(BaseModel):
    """One detector firing at one step."""

    model_config = ConfigDict(extra="forbid")

    step: int
    detector: str
    severity: Severity
    message: str
    """One sentence a person can act on, with the numbers in it."""
    evidence: dict[str, Any] = Field(default_factory=dict)
    """The statistics behind the message; `stream` (when present) names the metric watched."""

    @property
    def stream(self) -> str:
        """What the cooldown is keyed on: the detector plus the metric stream it watched."""
        return f"{self.detector}:{self.evidence.get('stream', '')}"

    def __str__(self) -> str:
        return f"[watch] step {self.step} {self.severity.upper()} {self.detector}: {self.message}"


def at_least(severity: str, floor: str) -> bool:
    """True when `severity` is as severe as `floor` or more."""
    return SEVERITY_RANK[severity] >= SEVERITY_RANK[floor]


def write_findings(path: str | Path, findings: list[Finding]) -> None:
    """Append findings to a JSONL file."""
    write_models(path, findings, append=True)


def read_findings(path: str | Path) -> list[Finding]:
    """Read `findings.jsonl`; a missing file means no findings."""
    return read_models(path, Finding, what="a finding", missing_ok=True)
