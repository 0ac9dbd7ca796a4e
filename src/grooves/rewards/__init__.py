"""Rewards: learned reward models, and the composition of several signals with gates.

rm = train_reward_model(read_examples("scores.jsonl"), HashedNgramEncoder(), RidgeHead())
reward = Composite([
    code("format", format_ok, weight=0.2),
    model("rm", rm, weight=0.3),
    judge("quality", GroupJudge(client, load_rubric("helpful.toml")), weight=0.5),
    gate("supported", AbsoluteJudge(client, load_rubric("supported.toml")), threshold=0.5),
])
stats = await reward.score_groups(groups)     # writes trajectory.reward and trajectory.rewards[name]
"""

from grooves.rewards.compose import (
    CodeSignal,
    Composite,
    GroupSignal,
    JudgeSignal,
    ModelSignal,
    RewardFn,
    SignalError,
    StepScores,
    Term,
    code,
    combine,
    gate,
    judge,
    model,
)
from grooves.rewards.encoders import Encoder, HashedNgramEncoder, HiddenStateEncoder
from grooves.rewards.heads import MLPHead, RidgeHead
from grooves.rewards.model import Example, FitReport, RewardModel, read_examples, train_reward_model

__all__ = [
    "CodeSignal",
    "Composite",
    "Encoder",
    "Example",
    "FitReport",
    "GroupSignal",
    "HashedNgramEncoder",
    "HiddenStateEncoder",
    "JudgeSignal",
    "MLPHead",
    "ModelSignal",
    "RewardFn",
    "RewardModel",
    "RidgeHead",
    "SignalError",
    "StepScores",
    "Term",
    "code",
    "combine",
    "gate",
    "judge",
    "model",
    "read_examples",
    "train_reward_model",
]
