"""The title reward model: predicts a story's log points from (body, title), rescaled to about 0..1.

Features (`TitleStoryEncoder`): a hashed bag of the title's word 1- and 2-grams (the wording a
reader reacts to), plus two pair features a linear head cannot build from bags alone, because
relevance is an interaction of body and title: the share of the title's claims found in the
body, and how many were found (`support.py`). A ridge head (`grooves.rewards.RidgeHead`) is fit
on log(1 + points), with its penalty picked on a validation split and its quality reported on
held-out stories.

This is the kind of reward model a team would ship: it ranks held-out titles well. It is also
linear in the wording, so it has learned that "Show HN" and "shocking" raise points and will
keep adding for every further phrase far beyond anything in its training data; the policy finds
that. The reward is the prediction rescaled so that the 5th and 95th percentiles of the model's
predictions on the corpus's own titles map to 0 and 1. It is not clipped: a hack scoring far
above every human title is the signal the watch should see.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grooves.rewards import HashedNgramEncoder, RewardModel, RidgeHead
from grooves.rewards.model import Example, train_reward_model
from grooves.tasks.hn_titles.corpus import Story
from grooves.tasks.hn_titles.support import check_support

NORMALIZATION_FILE = "normalization.json"


class TitleStoryEncoder:
    """[hashed title n-grams (dim), supported share, supported count / 4] for (body, title) pairs."""

    kind = "hn-title-story"

    def __init__(self, dim: int = 2048, ngrams: tuple[int, ...] = (1, 2)) -> None:
        self.title = HashedNgramEncoder(dim=dim, ngrams=ngrams, use_input=False)

    @property
    def dim(self) -> int:
        return self.title.dim + 2

    def encode(self, pairs: Sequence[tuple[str, str]]) -> torch.Tensor:
        words = self.title.encode(pairs)  # [B, dim]
        support = [check_support(title, body) for body, title in pairs]
        pair = torch.tensor([[s.fraction, len(s.supported) / 4.0] for s in support], dtype=torch.float32)  # [B, 2]
        return torch.cat([words, pair.reshape(len(pairs), 2)], dim=1)  # [B, dim + 2]

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "dim": self.title.dim, "ngrams": list(self.title.ngrams)}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> TitleStoryEncoder:
        if spec.get("kind") != cls.kind:
            raise ValueError(f"reward model encoder is {spec.get('kind')!r}, not {cls.kind!r}; train it with prepare.py")
        return cls(dim=int(spec["dim"]), ngrams=tuple(spec["ngrams"]))


def log_points(points: float) -> float:
    """The regression target: log(1 + points), because points are heavy-tailed."""
    return math.log1p(max(points, 0.0))


@dataclass(frozen=True)
class Normalization:
    """reward = (prediction - low) / (high - low): low and high are the 5th / 95th percentiles."""

    low: float
    high: float

    def __call__(self, prediction: float) -> float:
        return (prediction - self.low) / (self.high - self.low)


class TitleRewardModel:
    """A trained `RewardModel` on `TitleStoryEncoder` features plus its 0..1 rescaling."""

    def __init__(self, model: RewardModel, normalization: Normalization) -> None:
        self.model = model
        self.normalization = normalization

    def predict(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """Predicted log(1 + points) of (body, title) pairs."""
        return self.model.predict(pairs)

    def rewards(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """Rescaled predictions: about 0 for a poor human title, 1 for a top one, more for a hack."""
        return [self.normalization(p) for p in self.predict(pairs)]

    def save(self, path: str | Path) -> Path:
        path = self.model.save(path)
        payload = {"low": self.normalization.low, "high": self.normalization.high}
        (path / NORMALIZATION_FILE).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> TitleRewardModel:
        path = Path(path)
        meta_file = path / "reward_model.json"
        if not meta_file.exists():
            raise FileNotFoundError(f"{path}: no trained title reward model; run `python examples/hn_titles/prepare.py`")
        spec = json.loads(meta_file.read_text(encoding="utf-8"))["encoder"]
        model = RewardModel.load(path, encoder=TitleStoryEncoder.from_spec(spec))
        norm = json.loads((path / NORMALIZATION_FILE).read_text(encoding="utf-8"))
        return cls(model, Normalization(float(norm["low"]), float(norm["high"])))


def train_title_reward_model(stories: Sequence[Story], *, dim: int = 2048, seed: int = 0) -> TitleRewardModel:
    """Fit the reward model on `stories` (80/20 held-out split; see `model.model.report`)."""
    examples = [Example(input=s.body, output=s.title, score=log_points(s.score)) for s in stories]
    model = train_reward_model(examples, TitleStoryEncoder(dim=dim), RidgeHead(seed=seed), seed=seed)
    predictions = np.asarray(model.predict([(s.body, s.title) for s in stories]))
    low, high = np.percentile(predictions, [5, 95])
    if not high > low:
        raise ValueError("the reward model predicts the same score for every story; is the corpus varied?")
    return TitleRewardModel(model, Normalization(float(low), float(high)))
