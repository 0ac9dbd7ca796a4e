"""Reward models: encoders, ridge and MLP heads, held-out correlation, save/load, use as a reward."""

from __future__ import annotations

import json
import random

import pytest
import torch

from grooves.core.trajectory import Trajectory
from grooves.rewards import (
    Example,
    HashedNgramEncoder,
    HiddenStateEncoder,
    MLPHead,
    RewardModel,
    RidgeHead,
    read_examples,
    train_reward_model,
)
from grooves.rewards.heads import ridge_fit

GOOD = ["clear", "correct", "precise", "helpful", "accurate", "concise", "relevant", "complete"]
BAD = ["wrong", "vague", "rude", "irrelevant", "confusing", "false", "sloppy", "padded"]
FILLER = [f"w{i}" for i in range(200)]


def synthetic(n: int, seed: int) -> list[Example]:
    """Outputs of 6-20 words; the score is the smoothed share of good among good+bad words, plus noise."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p_good, p_bad = rng.uniform(0, 0.4), rng.uniform(0, 0.4)
        words = []
        for _ in range(rng.randint(6, 20)):
            u = rng.random()
            pool = GOOD if u < p_good else BAD if u < p_good + p_bad else FILLER
            words.append(rng.choice(pool))
        g, b = sum(w in GOOD for w in words), sum(w in BAD for w in words)
        score = min(1.0, max(0.0, (g + 1) / (g + b + 2) + rng.gauss(0, 0.03)))
        out.append(Example(input=f"Explain {rng.choice(FILLER)}.", output=" ".join(words), score=score))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ridge_on_hashed_ngrams_reaches_held_out_correlation(seed):
    # measured on seeds 0, 1, 2 (n=400, dim 4096): Pearson 0.926 / 0.899 / 0.920
    model = train_reward_model(synthetic(400, seed), HashedNgramEncoder(dim=4096), RidgeHead(), seed=seed)
    r = model.report
    assert (r.n_train, r.n_test) == (320, 80)
    assert r.pearson > 0.88 and r.spearman > 0.88
    assert r.head["l2"] in (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)


def test_mlp_head_reaches_held_out_correlation():
    # measured (n=400, dim 1024, seed 0): Pearson 0.901; the penalty is picked on a validation split
    model = train_reward_model(synthetic(400, 0), HashedNgramEncoder(dim=1024), MLPHead())
    assert model.report.pearson > 0.85
    assert model.report.head["l2"] in (1e-3, 1e-2, 1e-1)


def test_a_model_that_sees_only_noise_does_not_correlate():
    rng = random.Random(0)
    noise = [Example(input="q", output=e.output, score=rng.random()) for e in synthetic(400, 0)]
    model = train_reward_model(noise, HashedNgramEncoder(dim=4096), RidgeHead())
    assert abs(model.report.pearson) < 0.3


def test_ridge_fit_matches_hand_computed_values():
    x = torch.tensor([[0.0], [1.0], [2.0]])
    y = torch.tensor([1.0, 3.0, 5.0])
    # centred x = [-1, 0, 1], sum x^2 = 2, sum x*y_c = 4: w = 4 / (2 + l2), b = 3 - 1 * w
    w, b = ridge_fit(x, y, 1.0)
    assert float(w[0]) == pytest.approx(4 / 3) and float(b) == pytest.approx(3 - 4 / 3)
    w, b = ridge_fit(x, y, 1e-9)
    assert float(w[0]) == pytest.approx(2.0) and float(b) == pytest.approx(1.0)


def test_ridge_dual_form_equals_primal():
    torch.manual_seed(0)
    x, y = torch.randn(5, 12), torch.randn(5)  # D > N: the dual solve is taken
    w, b = ridge_fit(x, y, 0.5)
    xc, yc = (x - x.mean(0)).double(), (y - y.mean()).double()
    primal = torch.linalg.solve(xc.T @ xc + 0.5 * torch.eye(12, dtype=torch.float64), xc.T @ yc)
    assert torch.allclose(w.double(), primal, atol=1e-5)
    assert float(b) == pytest.approx(float(y.mean() - x.mean(0) @ w), abs=1e-5)


def test_hashed_encoder_is_deterministic_normalized_and_keeps_input_apart():
    enc = HashedNgramEncoder(dim=256)
    a = enc.encode([("the question", "good answer"), ("", "")])
    assert torch.equal(a, HashedNgramEncoder(dim=256).encode([("the question", "good answer"), ("", "")]))
    assert float(a[0].norm()) == pytest.approx(1.0) and float(a[1].abs().sum()) == 0.0
    swapped = enc.encode([("good answer", "the question")])
    assert not torch.allclose(a[0], swapped[0])
    assert torch.allclose(
        HashedNgramEncoder(dim=256, use_input=False).encode([("x y", "z")]),
        HashedNgramEncoder(dim=256, use_input=False).encode([("other", "z")]),
    )
    with pytest.raises(ValueError, match="dim must be >= 8"):
        HashedNgramEncoder(dim=4)


@pytest.mark.parametrize("head", [RidgeHead(), MLPHead(epochs=50)])
def test_save_load_round_trip_and_reward_signature(tmp_path, head):
    model = train_reward_model(synthetic(60, 3), HashedNgramEncoder(dim=512), head)
    path = model.save(tmp_path / "rm")
    assert sorted(p.name for p in path.iterdir()) == ["head.safetensors", "reward_model.json"]
    meta = json.loads((path / "reward_model.json").read_text())
    assert meta["encoder"] == {"kind": "hashed-ngrams", "dim": 512, "ngrams": [1, 2], "use_input": True}
    loaded = RewardModel.load(path)
    pairs = [("Explain w3.", "clear correct w5"), ("Explain w4.", "wrong vague w6")]
    assert loaded.predict(pairs) == pytest.approx(model.predict(pairs), abs=1e-6)
    assert loaded.report == model.report
    traj = Trajectory(
        messages=[{"role": "user", "content": pairs[0][0]}, {"role": "assistant", "content": pairs[0][1]}]
    )
    assert loaded.reward(traj, {}) == pytest.approx(model.predict(pairs[:1])[0], abs=1e-6)


def test_load_rejects_a_mismatched_encoder(tmp_path):
    path = train_reward_model(synthetic(40, 0), HashedNgramEncoder(dim=64), RidgeHead()).save(tmp_path / "rm")
    with pytest.raises(ValueError, match="does not match the saved one"):
        RewardModel.load(path, encoder=HashedNgramEncoder(dim=128))
    with pytest.raises(FileNotFoundError, match="not a saved reward model"):
        RewardModel.load(tmp_path)


def test_read_examples_takes_judge_score_files_and_names_bad_lines(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_text(
        json.dumps({"id": "a", "input": "q", "output": "x", "score": 0.5, "reason": "ok"})
        + "\n"
        + json.dumps({"id": "b", "input": "q", "output": "y", "score": None, "error": "judge failed"})
        + "\n\n"
    )
    assert read_examples(path) == [Example(input="q", output="x", score=0.5)]
    path.write_text(json.dumps({"input": "q", "score": 1.0}) + "\n")
    with pytest.raises(ValueError, match=r"scores.jsonl:1: output: Field required"):
        read_examples(path)
    with pytest.raises(ValueError, match="at least 10 scored examples"):
        train_reward_model(synthetic(5, 0), HashedNgramEncoder(dim=64), RidgeHead())


def test_hidden_state_encoder_mean_pools_without_padding_leaking(tiny_model_dir):
    enc = HiddenStateEncoder.from_dir(tiny_model_dir, batch_size=4)
    short = ("hi", "yes")
    long = ("The quick brown fox jumps over the lazy dog.", "A long answer about the fox and the dog " * 3)
    alone = enc.encode([short])
    batched = enc.encode([short, long])
    assert alone.shape == (1, 32) and batched.shape == (2, 32)
    assert torch.allclose(alone[0], batched[0], atol=1e-5)
    assert not torch.allclose(batched[0], batched[1])
    assert all(not p.requires_grad for p in enc.model.parameters())


def test_reward_model_on_a_causal_lms_hidden_states_saves_and_reloads(tiny_model_dir, tmp_path):
    enc = HiddenStateEncoder.from_dir(tiny_model_dir, batch_size=16)
    model = train_reward_model(synthetic(60, 1), enc, RidgeHead())
    assert model.report.n_test == 12
    path = model.save(tmp_path / "rm")
    assert json.loads((path / "reward_model.json").read_text())["encoder"]["model_dir"] == str(tiny_model_dir)
    loaded = RewardModel.load(path)
    pairs = [("Explain w1.", "clear w2 correct"), ("Explain w1.", "wrong w2 rude")]
    assert loaded.predict(pairs) == pytest.approx(model.predict(pairs), abs=1e-5)


SENTIMENT_GOOD = ["great", "excellent", "wonderful", "delightful", "superb", "lovely"]
SENTIMENT_BAD = ["terrible", "awful", "dreadful", "horrible", "disappointing", "boring"]
SUBJECTS = [
    "The film",
    "This book",
    "The meal",
    "Our trip",
    "The concert",
    "That game",
    "The hotel",
    "His talk",
]


def sentiment(n: int, seed: int) -> list[Example]:
    """Short reviews mixing positive and negative adjectives; score = share of positive ones."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(1, 4)
        pos = rng.randint(0, k)
        words = rng.sample(SENTIMENT_GOOD, pos) + rng.sample(SENTIMENT_BAD, k - pos)
        rng.shuffle(words)
        text = (
            f"{rng.choice(SUBJECTS)} was "
            + ", ".join(words[:-1])
            + (" and " if k > 1 else "")
            + words[-1]
            + "."
        )
        out.append(Example(input="Write a one-line review.", output=text, score=pos / k))
    return out


@pytest.mark.slow
def test_smollm2_hidden_states_predict_review_sentiment():
    from grooves.models import ensure_model

    torch.set_num_threads(2)
    enc = HiddenStateEncoder.from_dir(ensure_model(), batch_size=32)
    model = train_reward_model(sentiment(300, 0), enc, RidgeHead())
    # measured: held-out Pearson 0.984 on 60 reviews; 0.037 with the labels shuffled (about 160 s on 2 CPUs)
    assert model.report.pearson > 0.9
