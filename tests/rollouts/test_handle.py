"""`model.complete`: the request it sends is the one docs/tasks.md documents."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from grooves.rollouts.handle import ModelHandle


class Recorder:
    def __init__(self):
        self.requests = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, **request):
        self.requests.append(request)
        return SimpleNamespace(choices=["first", "second"])


def test_complete_asks_with_the_handles_sampling_settings_and_a_seed_per_turn():
    client = Recorder()
    handle = ModelHandle(client, "policy", temperature=0.7, top_p=0.9, max_tokens=32, seed=5).for_rollout(
        3, 0, 1
    )
    messages = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert asyncio.run(handle.complete(messages)) == "first"
    assert asyncio.run(handle.complete(messages, tools, n=2)) == ["first", "second"]
    first, second = client.requests
    assert {k: v for k, v in first.items() if k != "seed"} == {
        "model": "policy",
        "messages": messages,
        "n": 1,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 32,
        "logprobs": True,
    }
    assert second["tools"] == tools and second["n"] == 2
    assert first["seed"] != second["seed"]  # one per turn
    again = Recorder()
    asyncio.run(ModelHandle(again, "policy", seed=5).for_rollout(3, 0, 1).complete(messages))
    assert again.requests[0]["seed"] == first["seed"]  # from (seed, step, group, rollout, turn) alone
