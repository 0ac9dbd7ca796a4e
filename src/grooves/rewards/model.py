"""Learned reward models: a frozen encoder plus a small regression head, trained on scored pairs.

When a judge is too slow or too costly to call on every rollout, or a person has labelled a few
hundred outputs, a reward model imitates those scores: (input, output, score) lines in a JSONL
file (a `grooves judge score` file works as is) -> features from a frozen encoder -> a ridge or
MLP head. Training holds out a test split and reports Pearson and Spearman on it, because a
reward model that does not rank held-out outputs like its teacher only teaches the policy its
errors. A saved model is a directory: `head.safetensors` (weights) and `reward_model.json`
(encoder spec, head settings, the held-out report).

As a reward, `RewardModel.reward(trajectory, scenario)` has the exact reward-function signature.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from safetensors.torch import load_file, save_file

from grooves.core.trajectory import Trajectory
from grooves.judge.agreement import mean_abs_diff, pearson, spearman
from grooves.judge.prompt import conversation_pair
from grooves.rewards.encoders import Encoder, Pair, encoder_from_spec
from grooves.rewards.heads import Head, head_from_saved

FORMAT = 1


class Example(BaseModel):
    """One scored pair; extra fields (ids, reasons, rubric tags) are ignored."""

    model_config = ConfigDict(extra="ignore")

    input: str
    output: str
    score: float


def read_examples(path: str | Path) -> list[Example]:
    """Read `{input, output, score}` lines; lines whose score is null (failed judgments) are skipped."""
    path = Path(path)
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            data = json.loads(line)
            if isinstance(data, dict) and data.get("score", 0.0) is None:
                continue
            try:
                out.append(Example.model_validate(data))
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ValueError(f"{path}:{lineno}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from exc
    return out


@dataclass(frozen=True)
class FitReport:
    """Held-out quality of a trained reward model."""

    n_train: int
    n_test: int
    pearson: float
    spearman: float
    mean_abs_error: float
    head: dict[str, Any]


class RewardModel:
    """Predicts a score for (input, output) pairs; usable as a reward function."""

    def __init__(self, encoder: Encoder, head: Head, report: FitReport | None = None) -> None:
        self.encoder = encoder
        self.head = head
        self.report = report

    def predict(self, pairs: Sequence[Pair]) -> list[float]:
        if not pairs:
            return []
        return [float(v) for v in self.head.predict(self.encoder.encode(pairs))]

    def predict_trajectories(self, trajectories: Sequence[Trajectory]) -> list[float]:
        """Batched predictions for trajectories, paired as in `conversation_pair`."""
        return self.predict([conversation_pair(t.messages) for t in trajectories])

    def reward(self, trajectory: Trajectory, scenario: dict[str, Any]) -> float:
        """`reward(trajectory, scenario) -> float`: the predicted score of this trajectory."""
        return self.predict_trajectories([trajectory])[0]

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_file(self.head.state(), str(path / "head.safetensors"))
        meta = {
            "format": FORMAT,
            "encoder": self.encoder.spec(),
            "head": {"kind": self.head.kind, "params": self.head.params()},
            "report": None if self.report is None else asdict(self.report),
        }
        (path / "reward_model.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path, *, encoder: Encoder | None = None) -> RewardModel:
        """Load a saved model; pass `encoder` to reuse one already in memory (it must match the spec)."""
        path = Path(path)
        meta_file = path / "reward_model.json"
        if not meta_file.exists():
            raise FileNotFoundError(f"{path} is not a saved reward model (no reward_model.json)")
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT:
            raise ValueError(
                f"{meta_file}: format {meta.get('format')!r}, this grooves reads format {FORMAT}"
            )
        if encoder is not None and encoder.spec() != meta["encoder"]:
            raise ValueError(f"encoder {encoder.spec()} does not match the saved one {meta['encoder']}")
        encoder = encoder or encoder_from_spec(meta["encoder"])
        head = head_from_saved(
            meta["head"]["kind"], meta["head"]["params"], load_file(str(path / "head.safetensors"))
        )
        report = FitReport(**meta["report"]) if meta.get("report") else None
        return cls(encoder, head, report)


def train_reward_model(
    examples: Sequence[Example], encoder: Encoder, head: Head, *, test_fraction: float = 0.2, seed: int = 0
) -> RewardModel:
    """Fit `head` on `encoder` features of a seeded train split; report on the held-out rest.

    The report (`model.report`) holds held-out Pearson, Spearman and mean |prediction - score|.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if len(examples) < 10:
        raise ValueError(f"need at least 10 scored examples to train and test, got {len(examples)}")
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n_test = max(2, int(round(len(examples) * test_fraction)))
    test, train = order[:n_test], order[n_test:]
    x = encoder.encode([(e.input, e.output) for e in examples])  # [N, D]
    y = torch.tensor([e.score for e in examples], dtype=torch.float32)  # [N]
    head.fit(x[train], y[train])
    pred = [float(v) for v in head.predict(x[test])]
    truth = [float(v) for v in y[test]]
    report = FitReport(
        n_train=len(train),
        n_test=len(test),
        pearson=pearson(pred, truth),
        spearman=spearman(pred, truth),
        mean_abs_error=mean_abs_diff(pred, truth),
        head=head.params(),
    )
    return RewardModel(encoder, head, report)
