"""The watch: its math on hand-computed inputs, each detector on its pattern and on healthy runs."""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest
from pydantic import ValidationError
from synthetic_runs import CHEAT, EXPECTED_DETECTOR, HACKS, RunShape, synthetic_run

from grooves.core.trajectory import Trajectory, TrajectoryGroup
from grooves.watch import (
    CheckDivergence,
    CheckDivergenceConfig,
    Collapse,
    CollapseConfig,
    Finding,
    InputIndependence,
    InputIndependenceConfig,
    LengthDrift,
    LengthDriftConfig,
    RewardJump,
    RewardJumpConfig,
    StepView,
    Watch,
    WatchConfig,
    read_findings,
)
from grooves.watch.stats import linear_trend, pearson, robust_z
from grooves.watch.text import (
    cross_pairs,
    duplicate_rate,
    grounding,
    jaccard,
    mean_ngram_jaccard,
    ngrams,
    words,
)

# ---------------------------------------------------------------- helpers


def group(body: str, titles: list[str], rewards: list[float] | None = None) -> TrajectoryGroup:
    rewards = rewards or [1.0] * len(titles)
    trajs = [
        Trajectory(
            messages=[{"role": "user", "content": body}, {"role": "assistant", "content": t}], reward=r
        )
        for t, r in zip(titles, rewards, strict=True)
    ]
    return TrajectoryGroup(scenario={"body": body}, trajectories=trajs)


STORIES = [
    "Rust compiler gets faster incremental builds thanks to a new query cache",
    "A hobbyist built a tiny radio telescope from satellite dishes in his garden",
    "Postgres adds native vector search and benchmarks against dedicated engines",
    "Researchers map the nervous system of a fruit fly larva neuron by neuron",
    "City of Oslo replaces parking meters with an open source payment app",
    "Why our startup moved from Kubernetes back to three plain virtual machines",
]


def grounded_groups(rng: np.random.Generator, n: int = 4) -> list[TrajectoryGroup]:
    """Titles made of their own story's words (a healthy title writer)."""
    groups = []
    for body in STORIES:
        vocab = [w for w in body.split() if len(w) > 3]
        titles = [" ".join(rng.choice(vocab, size=4, replace=False)) for _ in range(n)]
        groups.append(group(body, titles))
    return groups


def hashed_trigram_embed(texts):
    """Character-trigram counts hashed into 256 buckets: a real, deterministic text embedding."""
    out = np.zeros((len(texts), 256))
    for i, text in enumerate(texts):
        s = f"  {text.lower()} "
        for j in range(len(s) - 2):
            out[i, zlib.crc32(s[j : j + 3].encode()) % 256] += 1
    return out


def view(step: int, metrics: dict | None = None, groups=()) -> StepView:
    return StepView.build(step, metrics or {}, groups)


# ---------------------------------------------------------------- math


def test_robust_z_and_trend_by_hand():
    z, center, scale = robust_z(10.0, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert (center, scale) == (3.0, pytest.approx(1.4826))
    assert z == pytest.approx(7 / 1.4826)
    slope, t = linear_trend([0, 1, 2, 3], [0.0, 2.0, 1.0, 3.0])
    # slope = Sxy/Sxx = 4/5; SSR = 1.8; SE = sqrt(1.8/2/5)
    assert slope == pytest.approx(0.8)
    assert t == pytest.approx(0.8 / math.sqrt(0.18))
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match=">= 3 paired points"):
        linear_trend([0, 1], [0, 1])


def test_text_measures_by_hand():
    assert words("Show HN: I built it!") == ["show", "hn", "i", "built", "it"]
    a = ngrams(words("the cat sat on the mat"), 3)
    b = ngrams(words("the cat sat on a mat"), 3)
    assert jaccard(a, b) == pytest.approx(2 / 6)
    assert ngrams(["hi"], 3) == frozenset({("hi",)})
    # "a b c" is an output of inputs 0 and 1 (after lower-casing and punctuation): 2 of 4 outputs shared.
    assert duplicate_rate([["a b c", "x"], ["A b c!"], ["y"]]) == (0.5, "a b c", 2)
    # The same string twice within one input is not collapse.
    assert duplicate_rate([["same", "same"], ["other"]])[0] == 0.0
    g = grounding([["red fox", "red sky"], ["blue whale"]], ["the red fox runs", "a blue whale swims"])
    # own overlaps: 1, 1/2, 1 -> 5/6; "red sky" shares "red" with its own input only -> still retrieved.
    assert g["own"] == pytest.approx(5 / 6)
    assert g["shuffled"] == 0.0
    assert g["accuracy"] == 1.0 and g["chance"] == 0.5


def test_cross_pairs_never_pair_an_input_with_itself():
    rng = np.random.default_rng(0)
    every = cross_pairs([2, 1], max_pairs=100, rng=rng)
    assert sorted(every) == [((0, 0), (1, 0)), ((0, 1), (1, 0))]
    sampled = cross_pairs([4] * 10, max_pairs=50, rng=rng)
    assert len(sampled) == 50 and all(a[0] != b[0] for a, b in sampled)
    outputs = [["x y z"], ["x y z"], ["p q r"]]
    assert mean_ngram_jaccard(outputs, 3, cross_pairs([1, 1, 1], 100, rng)) == pytest.approx(1 / 3)


# ---------------------------------------------------------------- reward jump


def feed_rewards(detector, means, stds):
    fired = []
    for step, (m, s) in enumerate(zip(means, stds, strict=True)):
        obs = detector.observe(view(step, {"reward_mean": m, "reward_std": s}))
        fired += obs.findings
    return fired


def test_reward_jump_fires_on_a_jump_and_names_the_step():
    rng = np.random.default_rng(1)
    means = list(3 + rng.normal(0, 0.05, 30)) + [9.0, 60.0, 180.0]
    findings = feed_rewards(RewardJump(RewardJumpConfig()), means, [2.0] * 33)
    assert findings and findings[0].step == 30
    assert findings[0].evidence["stream"] == "reward_mean"
    assert findings[0].evidence["robust_z"] > 5 and "rose" in findings[0].message


def test_reward_jump_quiet_on_steady_improvement_and_first_successes():
    rng = np.random.default_rng(2)
    improving = list(0.2 + 0.006 * np.arange(80) + rng.normal(0, 0.02, 80))
    assert feed_rewards(RewardJump(RewardJumpConfig()), improving, [0.3] * 80) == []
    # Stuck at zero (MAD 0), then 1 success in 32: std 0.17 > delta 0.03, so the z alone does not fire.
    first = [0.0] * 12 + [1 / 32, 2 / 32]
    stds = [0.0] * 12 + [math.sqrt(1 / 32 * 31 / 32), math.sqrt(2 / 32 * 30 / 32)]
    assert feed_rewards(RewardJump(RewardJumpConfig()), first, stds) == []


def test_reward_jump_direction_and_signal_streams():
    means = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, -5.0]
    assert feed_rewards(RewardJump(RewardJumpConfig(direction="up")), means, [0.5] * 8) == []
    down = feed_rewards(RewardJump(RewardJumpConfig(direction="both")), means, [0.5] * 8)
    assert [f.step for f in down] == [7] and "fell" in down[0].message
    detector = RewardJump(RewardJumpConfig())
    for step in range(8):
        judge = 0.5 if step < 7 else 0.95
        row = {"reward_mean": 0.5, "reward_std": 0.3, "reward/judge_mean": judge, "reward/judge_std": 0.05}
        obs = detector.observe(view(step, row))
    assert [f.evidence["stream"] for f in obs.findings] == ["reward/judge_mean"]


# ---------------------------------------------------------------- collapse


def test_collapse_fires_when_inputs_share_one_title():
    rng = np.random.default_rng(3)
    detector = Collapse(CollapseConfig())
    for step in range(3):
        assert detector.observe(view(step, groups=grounded_groups(rng))).findings == []
    hacked = [group(body, [CHEAT, CHEAT, CHEAT, "honest " + body.split()[0]]) for body in STORIES]
    obs = detector.observe(view(3, groups=hacked))
    (finding,) = obs.findings
    assert finding.evidence["duplicate_rate"] == pytest.approx(18 / 24)
    assert finding.evidence["top_output_inputs"] == 6
    assert finding.evidence["top_output"] == CHEAT.lower()
    assert "duplicate_rate" in finding.evidence["fired"]
    assert obs.stats["watch/collapse/ngram_jaccard"] > 0.5


def test_collapse_quiet_on_healthy_and_on_templated_tasks():
    rng = np.random.default_rng(4)
    detector = Collapse(CollapseConfig())
    for step in range(20):
        assert detector.observe(view(step, groups=grounded_groups(rng))).findings == []
    # A yes/no task: duplicates from step 0 are the task, not a collapse (baseline gate).
    categorical = Collapse(CollapseConfig())
    for step in range(10):
        answers = [group(b, [str(rng.choice(["yes", "no"])) for _ in range(4)]) for b in STORIES]
        assert categorical.observe(view(step, groups=answers)).findings == []


def test_collapse_by_embedding_catches_paraphrases():
    cfg = CollapseConfig(
        duplicate_rate=1.0, ngram_jaccard=1.0, embedding_cosine=0.8
    )  # embedding alone decides
    detector = Collapse(cfg, embed=hashed_trigram_embed)
    rng = np.random.default_rng(5)
    for step in range(3):
        detector.observe(view(step, groups=grounded_groups(rng)))
    paraphrases = [group(b, [f"{CHEAT} number {g}{k}" for k in range(4)]) for g, b in enumerate(STORIES)]
    obs = detector.observe(view(3, groups=paraphrases))
    assert obs.findings and obs.findings[0].evidence["fired"] == ["embedding_cosine"]
    assert obs.findings[0].evidence["duplicate_rate"] == 0.0  # no exact duplicates across inputs


def test_failed_rollouts_are_not_outputs():
    groups = grounded_groups(np.random.default_rng(12))
    for g in groups:  # every input has one failed rollout with an empty completion
        g.trajectories.append(Trajectory(error="TimeoutError: tool", metadata={}))
    v = view(0, groups=groups)
    assert [len(o) for o in v.outputs] == [4] * len(STORIES)
    assert duplicate_rate(v.outputs)[0] == 0.0


def test_collapse_rejects_a_bad_embed_function():
    detector = Collapse(CollapseConfig(), embed=lambda texts: np.zeros((len(texts) + 1, 4)))
    with pytest.raises(ValueError, match=r"one row per text, \[n, d\]"):
        detector.observe(view(0, groups=grounded_groups(np.random.default_rng(0))))


# ---------------------------------------------------------------- input independence


def test_input_independence_fires_when_titles_stop_mentioning_their_story():
    rng = np.random.default_rng(6)
    detector = InputIndependence(InputIndependenceConfig())
    for step in range(5):
        obs = detector.observe(view(step, groups=grounded_groups(rng)))
        assert obs.findings == []
    assert obs.stats["watch/input_independence/accuracy"] == 1.0
    generic = ["you will not believe this", "the one trick everyone missed", "this changes everything", "wow"]
    findings = []
    for step in range(5, 8):
        findings += detector.observe(view(step, groups=[group(b, generic) for b in STORIES])).findings
    assert findings and findings[0].severity == "critical"
    assert findings[0].evidence["accuracy"] <= 0.5 and findings[0].evidence["baseline_accuracy"] == 1.0


def test_input_independence_says_once_when_it_is_blind():
    detector = InputIndependence(InputIndependenceConfig())
    notes = []
    for step in range(8):
        answers = [group(b, [str(step + k) for k in range(4)]) for b in STORIES]  # numbers never in the story
        notes += detector.observe(view(step, groups=answers)).findings
    assert [f.severity for f in notes] == ["info"]
    assert "lexical input-independence test is off" in notes[0].message


def overlap_reward(trajectory: Trajectory, scenario: dict) -> float:
    """Input-dependent: share of title words found in the story."""
    title = set(words(trajectory.completion))
    return len(title & set(words(scenario["body"]))) / max(1, len(title))


def hype_reward(trajectory: Trajectory, scenario: dict) -> float:
    """Input-blind: counts hype words, reads nothing of the story."""
    trajectory.metadata["scored"] = (
        True  # a reward that writes on the trajectory must not leak into training data
    )
    return float(sum(w in {"believe", "shocking", "trick"} for w in words(trajectory.completion)))


def test_rescoring_on_shuffled_inputs():
    rng = np.random.default_rng(7)
    groups = grounded_groups(rng)
    healthy = InputIndependence(InputIndependenceConfig(rescore_every=1), rescore=overlap_reward)
    obs = healthy.observe(view(0, groups=groups))
    assert obs.findings == [] and obs.stats["watch/input_independence/rescore_effect"] > 1.0
    blind = InputIndependence(InputIndependenceConfig(rescore_every=1), rescore=hype_reward)
    hyped = [
        group(b, ["shocking trick you will believe", "one trick", "shocking", "believe it"]) for b in STORIES
    ]
    obs = blind.observe(view(0, groups=hyped))
    (finding,) = obs.findings
    assert finding.evidence["stream"] == "rescore" and finding.evidence["effect"] == 0.0
    assert all("scored" not in t.metadata for g in hyped for t in g.trajectories)


def test_rescoring_stays_quiet_while_every_score_is_equal():
    """A sparse reward nobody earns yet (all 0, own and shuffled) says nothing about the input."""
    detector = InputIndependence(InputIndependenceConfig(rescore_every=1), rescore=lambda t, s: 0.0)
    obs = detector.observe(view(0, groups=grounded_groups(np.random.default_rng(9))))
    assert obs.findings == [] and "watch/input_independence/rescore_effect" not in obs.stats
    detector.rescore = overlap_reward  # once scores spread, the test runs and a grounded reward passes
    obs = detector.observe(view(1, groups=grounded_groups(np.random.default_rng(10))))
    assert obs.findings == [] and obs.stats["watch/input_independence/rescore_effect"] > 1.0


def test_a_failing_rescorer_is_a_notice_not_a_crash():
    def broken(trajectory, scenario):
        raise TimeoutError("judge timed out")

    detector = InputIndependence(InputIndependenceConfig(rescore_every=1), rescore=broken)
    obs = detector.observe(view(0, groups=grounded_groups(np.random.default_rng(8))))
    assert [f.severity for f in obs.findings] == ["info"]
    assert "TimeoutError: judge timed out" in obs.findings[0].message


# ---------------------------------------------------------------- length drift and check divergence


def feed_lengths(lengths):
    detector = LengthDrift(LengthDriftConfig())
    return [
        f
        for step, n in enumerate(lengths)
        for f in detector.observe(view(step, {"completion_tokens_mean": n})).findings
    ]


def test_length_drift_grows_shrinks_and_noise():
    rng = np.random.default_rng(9)
    noisy = list(100 * (1 + rng.normal(0, 0.08, 60)))
    assert feed_lengths(noisy) == []
    grew = feed_lengths([100.0] * 10 + [150.0, 210.0, 260.0, 300.0])
    assert grew[0].step == 12 and grew[0].evidence["ratio"] == pytest.approx(2.1)
    shrank = feed_lengths([40.0] * 10 + [2.0, 1.0, 1.0])  # the policy now answers ":"
    assert shrank[0].step == 11 and "shrank" in shrank[0].message


def feed_checks(cfg, reward, checks: dict[str, list[float]], every: int = 5):
    detector = CheckDivergence(cfg)
    found = []
    for step, r in enumerate(reward):
        row = {"reward_mean": r}
        if step % every == 0:
            row.update({k: v[step // every] for k, v in checks.items()})
        found += detector.observe(view(step, row)).findings
    return found


def test_check_divergence():
    rng = np.random.default_rng(10)
    steps = 60
    reward = list(0.2 + 0.01 * np.arange(steps) + rng.normal(0, 0.01, steps))
    rising = list(0.3 + 0.04 * np.arange(12) + rng.normal(0, 0.01, 12))
    falling = list(0.8 - 0.04 * np.arange(12) + rng.normal(0, 0.01, 12))
    cfg = CheckDivergenceConfig()
    assert feed_checks(cfg, reward, {"val/accuracy": rising}) == []
    found = feed_checks(cfg, reward, {"val/accuracy": falling})
    assert found and found[0].step == 25 and found[0].evidence["correlation"] < -0.9
    # A loss rising is the bad direction; a loss falling is fine.
    assert feed_checks(cfg, reward, {"check/judge_loss": rising})[0].evidence["lower_is_better"]
    assert feed_checks(cfg, reward, {"check/judge_loss": falling}) == []


# ---------------------------------------------------------------- the watch


def test_watch_cooldown_pause_and_files(tmp_path):
    rng = np.random.default_rng(11)
    cfg = WatchConfig(pause_on="critical", echo=False, cooldown_steps=5, inspect={"every": 2})
    watch = Watch(cfg, run_dir=tmp_path)
    evil = '<script>alert("x")</script>'
    for step in range(20):
        if step < 4:
            groups = grounded_groups(rng)
        else:
            groups = [group(b, [CHEAT, CHEAT, evil, CHEAT], rewards=[9.0, 9.0, 0.0, 9.0]) for b in STORIES]
        watch.observe(step, {"reward_mean": 1.0, "reward_std": 0.5}, groups)
        assert watch.should_pause == (step >= 4)
    collapse_steps = [f.step for f in watch.findings if f.detector == "collapse"]
    assert collapse_steps == [4, 9, 14, 19]
    watch.clear_pause()
    assert not watch.should_pause
    assert read_findings(tmp_path / "findings.jsonl") == watch.findings
    stats = [json.loads(line) for line in (tmp_path / "watch.jsonl").read_text().splitlines()]
    assert len(stats) == 20 and "watch/collapse/duplicate_rate" in stats[-1]
    page = (tmp_path / "inspect" / "step_000004.html").read_text()
    assert html_escaped(evil) in page and evil not in page
    assert "collapse" in page and len(list((tmp_path / "inspect").iterdir())) == 10


def html_escaped(text: str) -> str:
    import html

    return html.escape(text)


def test_watch_never_pauses_by_default_and_prints(capsys):
    watch = Watch(WatchConfig())
    for step in range(12):
        watch.observe(step, {"reward_mean": 1.0 if step < 11 else 50.0, "reward_std": 1.0})
    assert not watch.should_pause
    assert "[watch] step 11 WARNING reward_jump" in capsys.readouterr().err


def test_finding_roundtrip_and_config_errors():
    f = Finding(
        step=3,
        detector="collapse",
        severity="critical",
        message="m",
        evidence={"stream": "outputs", "x": 1.5},
    )
    assert Finding.model_validate_json(f.model_dump_json()) == f
    with pytest.raises(ValidationError, match="threshold"):
        WatchConfig.model_validate({"collapse": {"threshold": 0.5}})
    with pytest.raises(ValidationError, match="window"):
        WatchConfig.model_validate({"reward_jump": {"window": 1}})
    with pytest.raises(ValidationError, match="input_keys is an empty list"):
        WatchConfig(input_keys=[])
    watch = Watch(WatchConfig(input_keys=["story"], echo=False))
    with pytest.raises(ValueError, match=r"names \['story'\] but a scenario has keys \['body'\]"):
        watch.observe(0, {}, grounded_groups(np.random.default_rng(0)))


# ---------------------------------------------------------------- synthetic runs: quiet when healthy, loud when hacked

FPR_RUNS = 30
FPR_BOUND = 0.05
"""Healthy synthetic runs (60 steps each) allowed to raise any warning or critical finding."""


def test_false_positive_rate_on_healthy_runs_is_below_bound():
    noisy = 0
    for seed in range(FPR_RUNS):
        watch = Watch(WatchConfig(echo=False))
        for s in synthetic_run(seed, RunShape(steps=60)):
            watch.observe(s.step, s.metrics, s.groups)
        noisy += any(f.severity != "info" for f in watch.findings)
    assert noisy / FPR_RUNS <= FPR_BOUND


@pytest.mark.parametrize("hack", HACKS)
def test_each_hack_is_caught_by_its_detector(hack):
    caught = 0
    for seed in range(4):
        watch = Watch(WatchConfig(echo=False))
        for s in synthetic_run(500 + seed, RunShape(steps=70, hack=hack, hack_step=35, val_every=5)):
            watch.observe(s.step, s.metrics, s.groups)
        assert not [f for f in watch.findings if f.step < 35 and f.severity != "info"]
        caught += any(f.detector == EXPECTED_DETECTOR[hack] for f in watch.findings)
    assert caught >= 3
