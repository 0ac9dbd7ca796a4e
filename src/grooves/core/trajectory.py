"""Trajectories and groups: the unit of training, logging and hacking analysis.

A `Trajectory` is one rollout of an agent on one scenario: the chat as the agent saw it, plus,
for every assistant turn the policy sampled, the exact token ids and logprobs it produced
("token in, token out"). Training uses those ids, never a re-tokenization of the text, because
re-tokenizing decoded text does not give back the same ids in multi-turn tool use.

A `TrajectoryGroup` holds the N rollouts of one scenario; group-relative advantages are computed
inside it. `grooves.rollouts.gather` runs many groups concurrently and records a failed rollout as data.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from grooves.jsonl import read_models, write_models


class SampledTurn(BaseModel):
    """One assistant completion as the policy sampled it.

    `prompt_token_ids` is the whole context the policy conditioned on (chat template applied,
    tools rendered); `token_ids`/`logprobs` are the sampled tokens and their logprobs under the
    sampling distribution (temperature applied, no top-p truncation), which the trainer uses as
    the old policy's logprobs.
    """

    model_config = ConfigDict(extra="forbid")

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str = ""
    finish_reason: str = "stop"
    adapter_version: int | None = None
    temperature: float = 1.0


class Trajectory(BaseModel):
    """One rollout: messages, the sampled turns with their tokens, reward and diagnostics."""

    model_config = ConfigDict(extra="forbid")

    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    turns: list[SampledTurn] = Field(default_factory=list)
    reward: float = 0.0
    rewards: dict[str, float] = Field(default_factory=dict)
    """Each reward signal by name (judge, reward model, gate, code check), logged separately."""
    metrics: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    """Set when the rollout failed; a failed trajectory is kept, counted, and not trained on."""

    def add_choice(self, choice: Any) -> None:
        """Record an OpenAI-style `Choice` returned by a grooves server.

        Appends the assistant message to `messages` and its token record to `turns`. The choice
        must carry grooves' extra fields (`token_ids`, `prompt_token_ids`); choices from other
        servers lack them and cannot be trained on, which is reported here rather than later.
        """
        extra = _choice_extra(choice)
        missing = [k for k in ("token_ids", "prompt_token_ids") if extra.get(k) is None]
        if missing:
            raise ValueError(
                f"choice lacks {', '.join(missing)}: it did not come from a grooves policy server, "
                "so its tokens cannot be trained on"
            )
        message = _as_dict(choice.message if hasattr(choice, "message") else choice["message"])
        message = {k: v for k, v in message.items() if v is not None}
        self.messages.append(message)
        logprobs = extra.get("sampled_logprobs")
        if logprobs is None:
            raise ValueError("choice lacks sampled_logprobs; ask the server with logprobs=True")
        self.turns.append(
            SampledTurn(
                prompt_token_ids=list(extra["prompt_token_ids"]),
                token_ids=list(extra["token_ids"]),
                logprobs=list(logprobs),
                text=message.get("content") or "",
                finish_reason=extra.get("finish_reason") or "stop",
                adapter_version=extra.get("adapter_version"),
                temperature=float(extra.get("temperature", 1.0)),
            )
        )

    @property
    def completion(self) -> str:
        """The text of the last assistant message (what single-turn tasks score)."""
        for m in reversed(self.messages):
            if m.get("role") == "assistant":
                return m.get("content") or ""
        return ""

    @property
    def num_sampled_tokens(self) -> int:
        return sum(len(t.token_ids) for t in self.turns)

    def to_json(self) -> str:
        return self.model_dump_json()


def _as_dict(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return dict(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    raise TypeError(f"cannot read message of type {type(obj).__name__}")


def _choice_extra(choice: Any) -> dict[str, Any]:
    if isinstance(choice, dict):
        return choice
    extra = dict(getattr(choice, "model_extra", None) or {})
    extra.setdefault("finish_reason", getattr(choice, "finish_reason", None))
    return extra


class TrajectoryGroup(BaseModel):
    """The N rollouts of one scenario; advantages are relative to the group."""

    model_config = ConfigDict(extra="forbid")

    scenario: dict[str, Any] = Field(default_factory=dict)
    trajectories: list[Trajectory] = Field(default_factory=list)

    @property
    def ok(self) -> list[Trajectory]:
        return [t for t in self.trajectories if t.error is None]

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.ok]

    def __len__(self) -> int:
        return len(self.trajectories)


def write_jsonl(path: str | Path, items: Iterable[BaseModel]) -> None:
    """Append pydantic records to a JSONL file, one per line."""
    write_models(path, items, append=True)


def read_groups(path: str | Path) -> list[TrajectoryGroup]:
    return read_models(path, TrajectoryGroup, what="a trajectory group")
