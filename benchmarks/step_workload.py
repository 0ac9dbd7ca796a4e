"""The work of one benchmarked GRPO step, shared by the grooves and the TRL worker processes.

Pure standard library on purpose: the TRL worker runs in its own virtualenv, which has no grooves.
The driver (`bench_grpo_step.py`) writes the scenarios to a JSON file; each worker reads it, runs
one step per `go` line on stdin and answers one marked JSON line on stdout, so the driver can
run the two frameworks in lockstep (step k of one, then step k of the other) and machine noise
lands on both alike.

The reward is the capitals check plus a small length term. The length term is there so no group
has all-equal rewards: grooves drops such a group (it has no gradient), TRL still runs its
forward and backward, and a timing comparison must give both the same work every step.
"""

from __future__ import annotations

import json
import sys
from typing import Any

MARK = "@@grpo-step "
"""Prefix of the workers' result lines; everything else on stdout is library chatter."""

SYSTEM_PROMPT = "Be brief."


def messages(country: str) -> list[dict[str, str]]:
    """The chat of one scenario, identical for both frameworks (the `capitals` task's prompt)."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"What is the capital of {country}?"},
    ]


def reward(text: str, capital: str) -> float:
    """1 if the answer names the capital, plus len(text) / 1000 so rewards in a group differ."""
    return float(capital.lower() in text.lower()) + len(text) / 1000


def load_scenarios(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def wait_for_go() -> bool:
    """Block until the driver says `go` (True) or `stop` / closes stdin (False)."""
    line = sys.stdin.readline().strip()
    return line == "go"


def emit(record: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(record) + "\n")
    sys.stdout.flush()


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def minor_faults() -> int:
    """Minor page faults of this process so far: each is a fresh page the kernel had to zero."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def peak_gpu_mib() -> float:
    """The most GPU memory torch's allocator of this process has held (0 without CUDA)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return 0.0
    return torch.cuda.max_memory_reserved() / 2**20
