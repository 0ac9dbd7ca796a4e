"""What a rollout function receives as `model`: an OpenAI client plus the run's sampling settings.

User agent code can use `model.client` as any `openai.AsyncOpenAI` (with `model.name` as the model),
or the shortcut `await model.complete(messages, tools)`, which asks with the run's temperature,
max tokens and logprobs, and with a seed derived from (run seed, step, scenario, rollout, turn).
Those seeds make sampling reproducible however the concurrent requests happen to be batched,
which is what lets a resumed run give the same next step as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass
class ModelHandle:
    client: Any
    name: str
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    seed: int | None = None
    """Base seed; None samples without a seed (non-reproducible)."""
    _turn: list[int] = field(default_factory=lambda: [0], repr=False)

    def for_rollout(self, *key: int) -> ModelHandle:
        """A copy whose request seeds depend on `key` (e.g. step, group, rollout index)."""
        if self.seed is None:
            return replace(self, _turn=[0])
        digest = hashlib.sha256(repr((self.seed, *key)).encode()).digest()
        return replace(self, seed=int.from_bytes(digest[:4], "little"), _turn=[0])

    def _next_seed(self) -> int | None:
        if self.seed is None:
            return None
        self._turn[0] += 1
        return (self.seed * 1_000_003 + self._turn[0]) % (2**31 - 1)

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *, n: int = 1
    ):
        """One chat completion with the run's sampling settings: the first choice (all `n` when `n` > 1).

        The request carries this handle's `temperature`, `top_p` and `max_tokens` (a training
        rollout's come from `[rollout]`, a validation's from `[validation]`: its temperature, top_p
        1.0), `logprobs=True` (training needs the sampled tokens' logprobs) and, when the handle
        is seeded, a seed from (run seed, step, scenario, rollout, turn). `tools` are OpenAI-style
        function definitions, rendered in the model's tool format.
        """
        request: dict[str, Any] = {
            "model": self.name,
            "messages": messages,
            "n": n,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "logprobs": True,
        }
        if tools:
            request["tools"] = tools
        seed = self._next_seed()
        if seed is not None:
            request["seed"] = seed
        response = await self.client.chat.completions.create(**request)
        return response.choices[0] if n == 1 else response.choices
