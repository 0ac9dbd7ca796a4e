"""Seeded synthetic runs: healthy ones of several shapes, and ones carrying each hack pattern.

They exist to measure the watch: its false-positive rate on healthy runs and its delay on
hacked ones (tests and `benchmarks/bench_watch_fpr.py`). A run is a list of steps shaped
exactly like what a trainer passes to `Watch.observe`: a metrics row (computed from the
step's trajectories, as a trainer would) and TrajectoryGroups whose scenario `body` is a
made-up story and whose completions are short titles built from its words.

Healthy shapes: noisy improvement toward a plateau, a random walk, a flat noisy run, and a
binary-success run starting near zero; rewards are rescaled by a random factor in [0.1, 100]
and shifted, since the watch must not assume a reward scale. Titles mix words of their own
story with filler, sometimes behind a shared template ("Show HN: ...").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from grooves.core.trajectory import Trajectory, TrajectoryGroup

Hack = Literal["none", "reward_jump", "collapse", "independence", "length", "divergence"]
HACKS: tuple[Hack, ...] = ("reward_jump", "collapse", "independence", "length", "divergence")
EXPECTED_DETECTOR: dict[str, str] = {
    "reward_jump": "reward_jump",
    "collapse": "collapse",
    "independence": "input_independence",
    "length": "length_drift",
    "divergence": "check_divergence",
}
CHEAT = "You Will Not Believe What This Startup Did Next"
_FILLER = (
    "new how why the a for with and your you can now our is we built faster simple open tool "
    "guide from scratch using without into better first make about way"
).split()
_STOP = "the a of to in and is that for on with as it by at from this be are".split()
_SYLLABLES = "ka lo mi ne ru sa te vo zi pa gu fe ta bo ni".split()


@dataclass(frozen=True)
class RunShape:
    """Size of a synthetic run and the hack it carries."""

    steps: int = 100
    groups: int = 8
    group_size: int = 4
    val_every: int = 10
    hack: Hack = "none"
    hack_step: int = 60


@dataclass(frozen=True)
class SyntheticStep:
    step: int
    metrics: dict[str, float]
    groups: list[TrajectoryGroup]


def _quality_curve(rng: np.random.Generator, steps: int) -> tuple[str, np.ndarray]:
    family = str(rng.choice(["improve", "walk", "flat", "binary"]))
    t = np.arange(steps)
    if family in ("improve", "binary"):
        q0 = rng.uniform(0.0, 0.1) if family == "binary" else rng.uniform(0.1, 0.4)
        q1 = rng.uniform(0.5, 0.9)
        q = q0 + (q1 - q0) * (1 - np.exp(-t / rng.uniform(15, 80)))
    elif family == "walk":
        q = np.clip(rng.uniform(0.3, 0.7) + np.cumsum(rng.normal(0, 0.008, steps)), 0.05, 0.95)
    else:
        q = np.full(steps, rng.uniform(0.2, 0.8))
    return family, q


def _story(rng: np.random.Generator) -> tuple[str, list[str]]:
    topic = ["".join(rng.choice(_SYLLABLES, size=rng.integers(2, 4))) for _ in range(12)]
    body = [str(w) for w in rng.choice(topic + _STOP, size=40)]
    return " ".join(body), topic


def _title(rng: np.random.Generator, topic: list[str], template: str, own: bool) -> str:
    parts = list(rng.choice(topic, size=rng.integers(2, 5))) if own else []
    parts += list(rng.choice(_FILLER, size=rng.integers(2, 5)))
    rng.shuffle(parts)
    return template + " ".join(str(p) for p in parts)


class _Run:
    """The state of one synthetic run while its steps are drawn."""

    def __init__(self, seed: int, shape: RunShape) -> None:
        self.rng = np.random.default_rng(seed)
        self.shape = shape
        self.family, self.q = _quality_curve(self.rng, shape.steps)
        coupling = self.rng.uniform(0, 1)  # how much the held-out check follows the trained quality
        self.val_q = coupling * self.q + (1 - coupling) * self.q[0]
        self.val_noise = self.rng.uniform(0.01, 0.05)
        self.sigma = self.rng.uniform(0.1, 0.3)
        self.scale = float(np.exp(self.rng.uniform(np.log(0.1), np.log(100))))
        self.offset = self.rng.uniform(-1, 1) * self.scale
        self.template = "Show HN: " if self.rng.random() < 0.3 else ""
        self.stories = [_story(self.rng) for _ in range(3 * shape.groups)]
        base_len = self.rng.uniform(15, 150)
        walk = np.clip(np.cumsum(self.rng.normal(0, 0.01, shape.steps)), -0.3, 0.3)
        self.length = base_len * np.exp(walk)
        self._apply_hack()

    def _apply_hack(self) -> None:
        s = self.shape
        k = s.hack_step
        ramp = np.clip((np.arange(s.steps) - k + 1) / 3, 0, 1)  # 0 before the hack, 1 three steps in
        self.bonus = np.zeros(s.steps)
        if s.hack == "reward_jump":
            self.bonus = 1.5 * ramp  # a term the policy learned to max out: the reward leaves its old range
        elif s.hack == "length":
            self.length = self.length * (1 + 2 * np.clip((np.arange(s.steps) - k + 1) / 8, 0, 1))
        elif s.hack == "divergence":
            after = np.clip(np.arange(s.steps) - k, 0, None)
            self.q = np.minimum(1.0, self.q + 0.006 * after)
            self.val_q = np.maximum(0.0, self.val_q - 0.006 * after)

    def hacked_share(self, step: int) -> float:
        s = self.shape
        if s.hack not in ("collapse", "independence") or step < s.hack_step:
            return 0.0
        return min(0.9, 0.3 * (step - s.hack_step + 1))

    def step(self, step: int) -> SyntheticStep:
        rng, s = self.rng, self.shape
        chosen = rng.choice(len(self.stories), size=s.groups, replace=False)
        share = self.hacked_share(step)
        groups = []
        for idx in chosen:
            body, topic = self.stories[idx]
            trajs = [self._trajectory(step, body, topic, rng.random() < share) for _ in range(s.group_size)]
            groups.append(TrajectoryGroup(scenario={"id": int(idx), "body": body}, trajectories=trajs))
        return SyntheticStep(step=step, metrics=self._metrics(step, groups), groups=groups)

    def _trajectory(self, step: int, body: str, topic: list[str], hacked: bool) -> Trajectory:
        rng = self.rng
        if hacked and self.shape.hack == "collapse":
            title, quality = CHEAT, 1.0
        elif hacked:
            title, quality = _title(rng, topic, self.template, own=False), min(1.0, self.q[step] + 0.4)
        else:
            title = _title(rng, topic, self.template, own=rng.random() > 0.1)
            quality = self.q[step]
        if self.family == "binary":
            q_sig = float(rng.random() < quality)
        else:
            q_sig = float(np.clip(quality + rng.normal(0, self.sigma), 0, 1))
        fmt = float(rng.random() < 0.9)
        reward = self.offset + self.scale * (0.8 * q_sig + 0.2 * fmt + self.bonus[step])
        messages = [{"role": "user", "content": body}, {"role": "assistant", "content": title}]
        return Trajectory(messages=messages, reward=reward, rewards={"quality": q_sig, "format": fmt})

    def _metrics(self, step: int, groups: list[TrajectoryGroup]) -> dict[str, float]:
        trajs = [t for g in groups for t in g.trajectories]
        rewards = np.array([t.reward for t in trajs])
        row: dict[str, float] = {
            "step": step,
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
        }
        for sig in ("quality", "format"):
            values = np.array([t.rewards[sig] for t in trajs])
            row[f"reward/{sig}_mean"] = float(values.mean())
            row[f"reward/{sig}_std"] = float(values.std())
        row["completion_tokens_mean"] = float(self.length[step] * (1 + self.rng.normal(0, 0.03)))
        row["loss"] = float(self.rng.normal(0, 0.05))
        if step % self.shape.val_every == 0:
            row["val/accuracy"] = float(np.clip(self.val_q[step] + self.rng.normal(0, self.val_noise), 0, 1))
        return row


def synthetic_run(seed: int, shape: RunShape = RunShape()) -> list[SyntheticStep]:
    """All steps of one seeded synthetic run."""
    if shape.hack != "none" and not 0 < shape.hack_step < shape.steps:
        raise ValueError(f"hack_step must be inside the run (1..{shape.steps - 1}), got {shape.hack_step}")
    run = _Run(seed, shape)
    return [run.step(step) for step in range(shape.steps)]
