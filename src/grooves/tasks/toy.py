"""Built-in task `toy_tokens`: a reward a tiny random model can learn in seconds.

For tests and smoke runs of the training loop, not a benchmark: the reward is the fraction of
sampled tokens that fall in a fixed subset of the vocabulary (ids below `vocab_fraction` of the
vocabulary size). A random policy scores about `vocab_fraction`; GRPO must push it up.
"""

from __future__ import annotations

from typing import Any

from grooves.core.trajectory import Trajectory
from grooves.rollouts.handle import ModelHandle


class ToyTokensTask:
    name = "toy_tokens"

    def __init__(self, vocab_size: int = 512, vocab_fraction: float = 0.25, num_scenarios: int = 16):
        self.threshold = int(vocab_size * vocab_fraction)
        self._prompts = [f"Write something, number {i}." for i in range(num_scenarios)]

    def scenarios(self, split: str) -> list[dict[str, Any]]:
        half = len(self._prompts) // 2
        chosen = self._prompts[:half] if split == "train" else self._prompts[half:]
        return [{"prompt": p} for p in chosen]

    async def rollout(self, model: ModelHandle, scenario: dict[str, Any]) -> Trajectory:
        traj = Trajectory(messages=[{"role": "user", "content": scenario["prompt"]}])
        traj.add_choice(await model.complete(traj.messages))
        tokens = traj.turns[-1].token_ids
        hits = sum(1 for t in tokens if t < self.threshold)
        traj.reward = hits / max(len(tokens), 1)
        traj.rewards["in_subset"] = traj.reward
        traj.metrics["success"] = float(traj.reward >= 0.5)
        return traj
