"""The title reward model: predicts a story's log points from (body, title), rescaled to about 0..1.

Features (`TitleStoryEncoder`): a hashed bag of the title's word 1- and 2-grams and a hashed bag
of the body's, each L2-normalized on its own (one shared norm would let the longer body drown
the title). A ridge head (`grooves.rewards.RidgeHead`) is fit on log(1 + points), with its
penalty picked on a validation split and its quality reported on held-out stories.

This is the reward model a team would ship first: cheap, deterministic, and it ranks held-out
titles well (see `prepare.py`). Its blind spot is the one the field knows. A linear model on bags
of words adds a weight per title word and a weight per body word; it cannot represent whether
the title fits the story, and it has learned that "Show HN" and "shocking" pay, so it keeps
adding for every further phrase far beyond anything in its data. The policy finds that. The
supported-claims gate (`support.py`) is exactly the signal it lacks.

The reward is the prediction rescaled so that the 5th and 95th percentiles of the model's
predictions on the corpus's own titles map to 0 and 1. It is not clipped: a hack scoring far
above every human title is what the watch should see.
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

from grooves.rewards import Example, HashedNgramEncoder, RewardModel, RidgeHead, train_reward_model
from hn_titles.corpus import Story

NORMALIZATION_FILE = "normalization.json"


class TitleStoryEncoder:
    """[hashed title n-grams (dim), hashed body n-grams (dim)] for (body, title) pairs, each half L2-normalized."""

    kind = "hn-title-story"

    def __init__(self, dim: int = 2048, ngrams: tuple[int, ...] = (1, 2)) -> None:
        self.title = HashedNgramEncoder(dim=dim, ngrams=ngrams, use_input=False)

    @property
    def dim(self) -> int:
        return 2 * self.title.dim

    def encode(self, pairs: Sequence[tuple[str, str]]) -> torch.Tensor:
        titles = self.title.encode(pairs)  # [B, dim]
        bodies = self.title.encode([("", body) for body, _ in pairs])  # [B, dim]
        return torch.cat([titles, bodies], dim=1)  # [B, 2 * dim]

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "dim": self.title.dim, "ngrams": list(self.title.ngrams)}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> TitleStoryEncoder:
        if spec.get("kind") != cls.kind:
            raise ValueError(
                f"reward model encoder is {spec.get('kind')!r}, not {cls.kind!r}; train it with prepare.py"
            )
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
            raise FileNotFoundError(
                f"{path}: no trained title reward model; run `python examples/hn_titles/prepare.py`"
            )
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
