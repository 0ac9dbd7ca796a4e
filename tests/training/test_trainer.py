"""The training loop on a tiny real model: reward goes up, resume equals an uninterrupted run; one step's update."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grooves.config import parse_config
from grooves.tasks.toy import ToyTokensTask
from grooves.training.data import ScenarioStream
from grooves.training.loop import train
from grooves.watch.finding import read_findings
from run_rows import assert_same_rows


def _config(model_dir, out, **over):
    data = {
        "name": "toy",
        "output_dir": str(out),
        "seed": 1,
        "steps": 16,
        "task": "toy_tokens",
        "task_options": {"vocab_size": 487, "num_scenarios": 16},
        "model": {"base_model": str(model_dir)},
        "rollout": {"group_size": 8, "groups_per_step": 8, "max_tokens": 4},
        "optim": {"lr": 5e-2},
        "lora": {"rank": 4, "alpha": 8},
        "validation": {"every": 8, "scenarios": 8},
        "logging": {"progress": False, "report": False},
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            data.setdefault(section, {})[field] = value
        else:
            data[section] = value
    return parse_config(data)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_grpo_raises_reward_on_toy_task(peaked_model_dir, tmp_path):
    run_dir = train(_config(peaked_model_dir, tmp_path / "run"))
    rows = [r for r in _rows(run_dir) if r.get("reward_mean") is not None]
    first = sum(r["reward_mean"] for r in rows[:3]) / 3
    last = sum(r["reward_mean"] for r in rows[-3:]) / 3
    assert first < 0.35  # a random policy hits the 25% subset about a quarter of the time
    assert last > first + 0.15, (first, last)
    # sampler and trainer agree on the logprobs of what was sampled
    assert max(r["mismatch_k3_mean"] for r in rows) < 1e-5
    # the run folder a person reads
    for name in ("config.toml", "metrics.jsonl", "reward_curve.png"):
        assert (run_dir / name).exists(), name
    assert not (run_dir / "report.html").exists()  # logging.report = false
    assert (run_dir / "samples" / "step_000016.jsonl").exists()
    assert (run_dir / "checkpoints" / "step_000016" / "adapter" / "adapter_model.safetensors").exists()
    assert rows[-1]["adapter_version"] == 16


@pytest.mark.parametrize(
    "loss,advantage,aggregation", [("cispo", "rloo", "sequence_mean"), ("gspo", "dr_grpo", "constant")]
)
def test_other_variants_train(peaked_model_dir, tmp_path, loss, advantage, aggregation):
    eps = {"algorithm__eps_low": 3e-4, "algorithm__eps_high": 4e-4} if loss == "gspo" else {}
    config = _config(
        peaked_model_dir,
        tmp_path / loss,
        steps=3,
        algorithm__loss=loss,
        algorithm__advantage=advantage,
        algorithm__aggregation=aggregation,
        algorithm__kl_beta=0.05,
        **eps,
    )
    rows = [r for r in _rows(train(config)) if "loss" in r]
    assert len(rows) == 3
    assert all(r["grad_norm"] > 0 for r in rows)
    assert all(r["kl_mean"] >= 0 for r in rows)  # k3 is non-negative


def _comparable(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("seconds_")}


def test_resume_gives_the_same_next_steps(peaked_model_dir, tmp_path):
    # 8 training scenarios, 4 per step: step 2 ends exactly at an epoch boundary
    over = {"steps": 4, "validation__every": 0, "rollout__groups_per_step": 4}
    full = _rows(train(_config(peaked_model_dir, tmp_path / "full", **over)))
    part_dir = tmp_path / "part"
    train(_config(peaked_model_dir, part_dir, **over), stop_after=2)
    assert len([r for r in _rows(part_dir) if "loss" in r]) == 2
    resumed = _rows(train(_config(peaked_model_dir, part_dir, **over), resume=True))
    assert [r["step"] for r in resumed] == [r["step"] for r in full]
    assert [_comparable(a).keys() for a in full] == [_comparable(b).keys() for b in resumed]
    assert_same_rows(full, resumed)


def test_two_runs_of_one_seed_with_the_default_fast_paths_are_identical(peaked_model_dir, tmp_path):
    # one request in flight at a time: the server batches by arrival, and a row decoded beside
    # others rounds differently (docs/speed.md), so on a loaded machine concurrent rollouts can
    # land in other batches; what this test pins down is everything else
    over = {"steps": 3, "validation__every": 0, "rollout__groups_per_step": 4, "rollout__concurrency": 1}
    runs = [
        [_comparable(r) for r in _rows(train(_config(peaked_model_dir, tmp_path / name, **over)))]
        for name in "ab"
    ]
    assert len([r for r in runs[0] if "loss" in r]) == 3
    assert runs[0] == runs[1]  # exactly: the same samples, losses and gradients, not merely close


def test_an_int8_sampler_run_logs_its_mismatch_and_weights_tokens_by_tis(peaked_model_dir, tmp_path):
    over = {
        "steps": 2,
        "validation__every": 0,
        "rollout__groups_per_step": 2,
        "model__sampler_precision": "int8",
        "algorithm__tis_cap": 2.0,
    }
    rows = [r for r in _rows(train(_config(peaked_model_dir, tmp_path / "run", **over))) if "loss" in r]
    assert len(rows) == 2
    for r in rows:
        assert 1e-6 < r["mismatch_k3_mean"] < 0.1  # int8 decode steps: not the trainer's function
        assert 0.5 < r["tis_weight_mean"] < 2.0 and 0.0 <= r["tis_capped_fraction"] <= 1.0
        assert r["clip_fraction"] == 0.0  # the ratio is taken against the trainer's own logprobs


def test_a_resumed_run_keeps_the_watchs_history(peaked_model_dir, tmp_path):
    """The detectors' baselines survive a resume: the same watch statistics and findings as a run that never stopped."""
    watch = {
        "length_drift": {"baseline_steps": 2, "smooth": 1, "max_ratio": 1.01, "min_ratio": 0.99},
        "reward_jump": {"min_history": 3, "window": 3, "z": 0.5, "min_delta_stds": 0.0},
    }
    over = {
        "steps": 6,
        "validation__every": 0,
        "rollout__groups_per_step": 4,
        "watch": {**watch, "pause_on": "never"},
    }
    full_dir, part_dir = tmp_path / "full", tmp_path / "part"
    train(_config(peaked_model_dir, full_dir, **over))
    train(_config(peaked_model_dir, part_dir, **over), stop_after=3)
    (part_dir / "watch.jsonl").write_text(
        (part_dir / "watch.jsonl").read_text() + '{"step": 4, "stale": 1}\n'
    )
    train(_config(peaked_model_dir, part_dir, **over), resume=True)

    def watch_rows(run_dir):
        return [json.loads(line) for line in (run_dir / "watch.jsonl").read_text().splitlines()]

    full, resumed = watch_rows(full_dir), watch_rows(part_dir)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]  # the stale line after the checkpoint is gone
    assert any(
        "watch/length_drift/ratio" in r for r in full[3:]
    )  # history-dependent statistics after the cut
    assert [a.keys() for a in full] == [b.keys() for b in resumed]
    assert_same_rows(full, resumed)
    full_findings = [(f.step, f.detector) for f in read_findings(full_dir / "findings.jsonl")]
    assert full_findings, "the loose thresholds above must make the watch fire"
    assert [(f.step, f.detector) for f in read_findings(part_dir / "findings.jsonl")] == full_findings


def test_a_given_watch_with_an_embedding_function_replaces_the_configured_one(peaked_model_dir, tmp_path):
    import numpy as np

    from grooves.watch import Watch

    seen: list[int] = []

    def embed(texts):  # a stand-in sentence encoder: character counts over a small alphabet
        seen.append(len(texts))
        return np.array([[t.count(c) + 1e-3 for c in "abcdefghij0123456789 "] for t in texts], dtype=float)

    config = _config(
        peaked_model_dir, tmp_path / "run", steps=2, validation__every=0, rollout__groups_per_step=4
    )
    train(config, watch=Watch(config.watch, embed=embed))
    rows = [json.loads(line) for line in (tmp_path / "run" / "watch.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # written into the run's folder
    assert all(0.0 <= r["watch/collapse/embedding_cosine"] <= 1.0 + 1e-9 for r in rows)
    assert seen and all(n == 4 * 8 for n in seen)  # every output of the step, once per step


# a process's start (imports, the model, the server) is most of a subprocess test's time: a small
# step (2 groups of 4) keeps the rest short; resuming does not depend on the step's size
SMALL_STEP = {"rollout__group_size": 4, "rollout__groups_per_step": 2}


def test_the_lr_schedule_resumes_exactly_after_a_real_kill(peaked_model_dir, tmp_path):
    """Warmup then cosine decay; SIGKILL after the 3rd checkpoint, --resume: every step is logged
    once, nothing lost or repeated, and its rate is the formula's, as in a run that never stopped.
    The resumed run says where it continues, and its output (a pipe, not a terminal) is one line
    per step."""
    from grooves.training.optim import lr_factor

    out = tmp_path / "killed"
    opt = {"optim__lr_schedule": "cosine", "optim__warmup_steps": 2, "optim__min_lr_ratio": 0.1}
    logging = {"progress": True, "report": False}
    config = _config(
        peaked_model_dir, out, steps=7, validation__every=0, logging=logging, **opt, **SMALL_STEP
    )
    (tmp_path / "run.toml").write_text(_toml(config))
    cmd = [sys.executable, "-m", "grooves.cli", "train", str(tmp_path / "run.toml")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while not (out / "checkpoints" / "step_000003" / "manifest.json").exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.time() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    kept = json.loads((out / "checkpoints" / "step_000003" / "state.json").read_text())["step"]
    newest = max(
        int(p.name[5:]) for p in (out / "checkpoints").glob("step_??????") if (p / "manifest.json").exists()
    )
    result = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == f"resuming {out} from step {newest} ({out / 'checkpoints' / f'step_{newest:06d}'})"
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == [f"{k}/7" for k in range(newest + 1, 8)]
    assert "\r" not in result.stdout + result.stderr  # no progress bar redraws in a log
    assert [r["step"] for r in _rows(out)] == list(range(8))  # the start's row and each step's, once
    rows = [r for r in _rows(out) if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 8)) and kept == 3
    expected = [
        5e-2 * lr_factor(k, schedule="cosine", warmup_steps=2, total_steps=7, min_ratio=0.1) for k in range(7)
    ]
    assert [r["lr"] for r in rows] == pytest.approx(expected, rel=1e-12, abs=0)
    assert rows[0]["lr"] == pytest.approx(5e-2 / 3) and rows[2]["lr"] == pytest.approx(5e-2)


def _toml(config) -> str:
    from grooves.config import dump_config

    return dump_config(config)


def test_scenario_stream_is_resumable_across_epochs():
    scenarios = [{"i": i} for i in range(5)]
    a = ScenarioStream(scenarios, seed=1)
    taken = [s["i"] for _, s in a.take(12)]
    assert sorted(taken[:5]) == list(range(5)) and sorted(taken[5:10]) == list(range(5))
    b = ScenarioStream(scenarios, seed=1, position=7)
    assert [s["i"] for _, s in b.take(5)] == taken[7:12]


# ---- one optimizer step (`optimize`) on a tiny policy ------------------------------------------
@pytest.fixture(scope="module")
def policy(peaked_model_dir):
    """A tiny policy whose LoRA B is not zero, so both A and B get gradients."""
    import torch

    from grooves.config import LoraConfig
    from grooves.policy.transformers import TransformersPolicy

    policy = TransformersPolicy(
        str(peaked_model_dir), lora=LoraConfig(rank=4, alpha=8), seed=0, served_name="tiny"
    )
    torch.manual_seed(0)
    for name, p in policy.model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0.0, 0.05)
    return policy


def _trainable(policy) -> dict:
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}


def _restore(policy, weights: dict) -> None:
    for n, p in policy.model.named_parameters():
        if n in weights:
            p.data.copy_(weights[n])
        p.grad = None


def _update(policy, seqs, config, stale_grad: float | None = None) -> tuple[dict, dict]:
    """(parameter change, stats) of one `optimize` with SGD at lr 1 and no clipping: the change is -gradient."""
    import torch

    from grooves.training.step import optimize, run_loss

    before = _trainable(policy)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    if stale_grad is not None:  # what an earlier, unfinished step could have left behind
        for p in params:
            p.grad = torch.full_like(p, stale_grad)
    stats = optimize(policy, torch.optim.SGD(params, lr=1.0), seqs, run_loss(config), config.optim)
    after = _trainable(policy)
    _restore(policy, before)
    return {n: after[n] - before[n] for n in before}, stats


def _on_policy(policy, seqs):
    """`seqs` with old logprobs recomputed by the policy itself, each token at its own temperature (ratio 1)."""
    import dataclasses

    import torch

    from grooves.core.forward import token_logprobs
    from grooves.core.tokenize import pad_batch

    with torch.no_grad():
        lp, _ = token_logprobs(policy.model, pad_batch(seqs))  # [B, T]
    return [
        dataclasses.replace(
            s,
            old_logprobs=[
                v if m else 0.0 for v, m in zip(lp[i, : len(s)].tolist(), s.sampled_mask, strict=True)
            ],
        )
        for i, s in enumerate(seqs)
    ]


def _group(prompt, completions, advantages, group_id, temperature=1.0):
    """Hand-made sequences: `completions` are lists of (ids, sampled) runs after a shared prompt."""
    from grooves.core.tokenize import TrainSequence

    seqs = []
    for runs, adv in zip(completions, advantages, strict=True):
        ids, mask = list(prompt), [False] * len(prompt)
        for run, sampled in runs:
            ids += run
            mask += [sampled] * len(run)
        temps = [temperature if m else 1.0 for m in mask]
        seqs.append(
            TrainSequence(ids, mask, [0.0] * len(ids), adv, group_id, len(prompt), temperatures=temps)
        )
    return seqs


def _alike_groups():
    """Completions that begin with the same sampled tokens (one-turn), and a multi-turn group whose
    members share their first sampled tokens and the tool text after them."""
    prompt = [1, 30, 31, 32, 33, 34, 35, 36, 37, 2]  # 10 tokens, past MIN_SHARED_PREFIX
    one_turn = _group(
        prompt,
        [[([60, 61, 62, 70], True)], [([60, 61, 62, 71, 72], True)], [([60, 61, 63], True)]],
        [1.0, -0.2, -0.5],
        0,
    )
    tool = [([80, 81], True), ([5, 90, 91, 92, 6], False)]  # a tool call, then its result (context)
    multi = _group(
        prompt[:9], [tool + [([100, 101], True)], tool + [([110], True)]], [0.7, -0.7], 1, temperature=0.8
    )
    return one_turn + multi


def _relative_error(a: dict, b: dict) -> float:
    import torch

    num = torch.sqrt(sum(((a[n] - b[n]) ** 2).sum() for n in a))
    return float(num / torch.sqrt(sum((b[n] ** 2).sum() for n in b)))


@pytest.mark.parametrize(
    "loss,aggregation,kl_beta",
    [
        ("ppo", "token_mean", 0.0),
        ("ppo", "token_mean", 0.1),
        ("gspo", "sequence_mean", 0.0),
        ("cispo", "constant", 0.0),
    ],
)
def test_shared_prefix_trains_sampled_tokens_that_begin_alike(
    policy, peaked_model_dir, tmp_path, loss, aggregation, kl_beta
):
    """The shared prefix stops before each member's first sampled token: same update as without it, ratio 1.

    (Advantages that sum to zero in a group would hide a lost token's policy gradient, as every
    member has the same gradient there; the KL term has no such cancellation.)
    """
    from grooves.core.batching import micro_batches

    eps = {"algorithm__eps_low": 3e-4, "algorithm__eps_high": 4e-4} if loss == "gspo" else {}
    over = dict(
        algorithm__loss=loss,
        algorithm__aggregation=aggregation,
        algorithm__kl_beta=kl_beta,
        optim__grad_clip=1e9,
        optim__micro_batch_tokens=4096,
        **eps,
    )
    seqs = _on_policy(policy, _alike_groups())
    shared = _config(peaked_model_dir, tmp_path, **over)
    assert [prefix for _, prefix in micro_batches(seqs, shared.optim, 0)] == [
        10,
        9,
    ]  # the prompts, not the alike tokens
    separate = _config(peaked_model_dir, tmp_path, optim__share_prefix=False, **over)
    update_shared, stats = _update(policy, seqs, shared)
    update_separate, _ = _update(policy, seqs, separate)
    assert _relative_error(update_shared, update_separate) < 1e-5
    assert max(float(u.abs().max()) for u in update_shared.values()) > 0
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert stats["clip_fraction"] == 0.0
    assert stats["mismatch_abs_max"] < 1e-5


def test_mismatch_abs_max_is_the_largest_over_micro_batches(policy, peaked_model_dir, tmp_path):
    import dataclasses

    seqs = _on_policy(policy, _alike_groups())
    at = seqs[3].sampled_mask.index(True)
    old = list(seqs[3].old_logprobs)
    old[at] -= 2.5  # one token of one sequence: the sampler saw it 2.5 nats less likely
    seqs[3] = dataclasses.replace(seqs[3], old_logprobs=old)
    config = _config(
        peaked_model_dir,
        tmp_path,
        optim__share_prefix=False,
        optim__packing=False,
        optim__micro_batch_tokens=16,
    )
    _, stats = _update(policy, seqs, config)
    assert stats["micro_batches"] == 5
    assert stats["mismatch_abs_max"] == pytest.approx(2.5, abs=1e-4)


def test_optimize_starts_from_zeroed_gradients(policy, peaked_model_dir, tmp_path):
    seqs = _on_policy(policy, _alike_groups())
    config = _config(peaked_model_dir, tmp_path, optim__grad_clip=1e9)
    clean, _ = _update(policy, seqs, config)
    stale, _ = _update(policy, seqs, config, stale_grad=100.0)
    assert _relative_error(stale, clean) < 1e-6
    assert max(float(u.abs().max()) for u in clean.values()) < 10  # the stale 100s are in neither


def _norm(weights) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(w) for w in weights])))


def test_an_exploding_update_is_not_applied_like_a_nonfinite_one(policy, peaked_model_dir, tmp_path, capsys):
    """AdamW at lr 1 moves every LoRA weight by about 1 in one step: the adapter's norm jumps
    more than tenfold, and its next rollouts would be garbage; the update is undone instead."""
    from grooves.training import step
    from grooves.training.step import NonFiniteStep, optimize, run_loss

    seqs = _on_policy(policy, _alike_groups())
    config = _config(peaked_model_dir, tmp_path, optim__lr=1.0)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    before = _trainable(policy)

    # what the update does when applied: the growth the guard measures, computed here from the weights
    unguarded = torch.optim.AdamW(params, lr=1.0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step, "MAX_WEIGHT_GROWTH", math.inf)
        optimize(policy, unguarded, seqs, run_loss(config), config.optim)
    growth = _norm(_trainable(policy).values()) / _norm(before.values())
    _restore(policy, before)
    assert growth > 10

    optimizer = torch.optim.AdamW(params, lr=1.0)
    capsys.readouterr()
    stats = optimize(policy, optimizer, seqs, run_loss(config), config.optim)
    assert (stats["exploding_skipped"], stats["nonfinite_skipped"]) == (1.0, 0.0)
    assert all(torch.equal(w, before[n]) for n, w in _trainable(policy).items())  # not applied
    assert len(optimizer.state) == 0  # nor counted in the optimizer's moments
    version = policy.adapters.version + 1
    assert capsys.readouterr().out.splitlines() == [
        f"step {version}: its update multiplied the adapter weights' norm by {growth:.3g} (more than 10x in "
        'one step, at lr 1); it was not applied; skipped (optim.on_nonfinite = "skip"; lower optim.lr if it '
        "happens again)"
    ]
    stop = _config(peaked_model_dir, tmp_path, optim__lr=1.0, optim__on_nonfinite="stop")
    with pytest.raises(NonFiniteStep, match=rf"^step {version}: its update multiplied .* the run stops"):
        optimize(policy, optimizer, seqs, run_loss(stop), stop.optim)
    assert all(torch.equal(w, before[n]) for n, w in _trainable(policy).items())

    # an ordinary rate is applied, its growth far below the bound
    stats = optimize(policy, torch.optim.AdamW(params, lr=1e-3), seqs, run_loss(config), config.optim)
    after = _trainable(policy)
    _restore(policy, before)
    assert stats["exploding_skipped"] == 0.0 and any(not torch.equal(after[n], before[n]) for n in before)
    assert 0.9 < _norm(after.values()) / _norm(before.values()) < 1.1


def test_constant_aggregation_divides_by_every_rollout_of_the_step(policy, peaked_model_dir, tmp_path):
    """Dr. GRPO: sum of token losses / (groups_per_step x group_size x max_tokens), a dropped group included."""
    from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup
    from grooves.training.step import optimize, run_loss, to_sequences

    prompt = [1, 30, 31, 32, 2]

    def traj(tokens, reward):
        return Trajectory(
            turns=[SampledTurn(prompt_token_ids=prompt, token_ids=tokens, logprobs=[0.0] * len(tokens))],
            reward=reward,
        )

    groups = [
        TrajectoryGroup(trajectories=[traj([40, 41, 42], 1.0), traj([50, 51], 0.0)]),
        TrajectoryGroup(trajectories=[traj([60], 1.0), traj([61, 62], 1.0)]),  # zero variance: dropped
    ]
    config = _config(
        peaked_model_dir,
        tmp_path,
        rollout__groups_per_step=2,
        rollout__group_size=2,
        rollout__max_tokens=4,
        algorithm__advantage="dr_grpo",
        algorithm__aggregation="constant",
    )
    seqs, seq_stats = to_sequences(groups, config)
    assert seq_stats["groups_zero_variance_fraction"] == 0.5 and [s.advantage for s in seqs] == [0.5, -0.5]
    import torch

    params = [p for p in policy.model.parameters() if p.requires_grad]
    before = _trainable(policy)
    stats = optimize(
        policy, torch.optim.SGD(params, lr=0.0), _on_policy(policy, seqs), run_loss(config), config.optim
    )
    _restore(policy, before)
    # on-policy PPO: each token's loss is -A; (3 x -0.5 + 2 x 0.5) / (2 groups x 2 rollouts x 4 tokens)
    assert stats["loss"] == pytest.approx(-0.5 / 16, abs=1e-6)


def test_gspo_and_sequence_mean_take_a_rollout_split_at_a_prefix_break_as_one(
    policy, peaked_model_dir, tmp_path
):
    """A rollout whose template broke the prefix is two token sequences, trained in micro-batches of
    16 tokens: the step still takes one GSPO ratio for it and gives it a quarter of the loss."""
    import dataclasses

    from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup
    from grooves.training.step import optimize, run_loss, to_sequences

    def turn(prompt, tokens):
        return SampledTurn(prompt_token_ids=prompt, token_ids=tokens, logprobs=[0.0] * len(tokens))

    broken = [turn([1, 30, 31, 32, 2], [40, 41, 42]), turn([1, 30, 31, 33, 2], [43, 44, 45])]
    trajs = [Trajectory(turns=broken, reward=1.0)]
    trajs += [
        Trajectory(turns=[turn([1, 30, 31, 34 + k, 2], [50 + k, 51])], reward=r)
        for k, r in enumerate([0, 0, 1])
    ]
    config = _config(
        peaked_model_dir,
        tmp_path,
        optim__micro_batch_tokens=16,
        algorithm__advantage="dr_grpo",  # A = r - mean = +0.5, -0.5, -0.5, +0.5
        algorithm__loss="gspo",
        algorithm__eps_low=0.2,
        algorithm__eps_high=0.2,
        algorithm__aggregation="sequence_mean",
    )
    seqs, seq_stats = to_sequences([TrajectoryGroup(trajectories=trajs)], config)
    assert len(seqs) == 5 and seq_stats["prefix_breaks"] == 1.0
    seqs = _on_policy(policy, seqs)
    # the first turn's tokens were sampled with logprob lp - 0.2: ratio e^0.2 = 1.22 each, past 1 + eps
    # alone; over the rollout's six tokens the ratio is e^0.1 = 1.105, inside the clip range
    seqs[0] = dataclasses.replace(
        seqs[0],
        old_logprobs=[
            v - 0.2 if m else v for v, m in zip(seqs[0].old_logprobs, seqs[0].sampled_mask, strict=True)
        ],
    )
    params = [p for p in policy.model.parameters() if p.requires_grad]
    before = _trainable(policy)
    stats = optimize(policy, torch.optim.SGD(params, lr=0.0), seqs, run_loss(config), config.optim)
    _restore(policy, before)
    assert stats["micro_batches"] >= 2
    # mean over the 4 rollouts of -min(s A, clip(s) A): -0.5 e^0.1, then -A = +0.5, +0.5, -0.5 (s = 1)
    assert stats["policy_loss"] == pytest.approx((-0.5 * math.exp(0.1) + 0.5) / 4, abs=1e-4)
    assert stats["clip_fraction"] == 0.0


def test_turns_are_trained_at_the_temperature_they_were_sampled_at(policy, peaked_model_dir, tmp_path):
    """Turns sampled at 0.5 and greedily, trained by a run whose rollout.temperature is 1: ratio 1."""
    import asyncio
    import dataclasses

    import torch

    from grooves.core.trajectory import Trajectory, TrajectoryGroup
    from grooves.rollouts.handle import ModelHandle
    from grooves.serve.app import inprocess_client
    from grooves.training.step import optimize, run_loss, to_sequences

    async def rollouts():
        client = inprocess_client(policy)
        out = []
        for k in range(2):
            handle = ModelHandle(client, policy.served_name, 0.5, 1.0, 6, seed=10 + k)
            traj = Trajectory(messages=[{"role": "user", "content": "hello world"}], reward=float(k))
            traj.add_choice(await handle.complete(traj.messages))
            traj.messages.append({"role": "user", "content": "yes no"})
            traj.add_choice(await dataclasses.replace(handle, temperature=0.0).complete(traj.messages))
            out.append(traj)
        await client.close()
        return out

    group = TrajectoryGroup(trajectories=asyncio.run(rollouts()))
    assert [t.temperature for t in group.trajectories[0].turns] == [0.5, 0.0]
    config = _config(peaked_model_dir, tmp_path, rollout__temperature=1.0)
    seqs, _ = to_sequences([group], config)
    assert {t for s in seqs for t, m in zip(s.temperatures, s.sampled_mask, strict=True) if m} == {0.5, 1.0}
    params = [p for p in policy.model.parameters() if p.requires_grad]
    before = _trainable(policy)
    stats = optimize(policy, torch.optim.SGD(params, lr=0.0), seqs, run_loss(config), config.optim)
    _restore(policy, before)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert stats["mismatch_abs_max"] < 1e-3 and stats["clip_fraction"] == 0.0


def _overflow_at(step: int):
    """A group scorer that gives step `step` rewards near the float32 limit: the loss overflows."""
    calls = [0]

    async def score(groups):
        if all(len(g) == 1 for g in groups):  # validation (one sample per scenario) is scored too: not a step
            return {}
        calls[0] += 1
        if calls[0] == step:
            for g in groups:
                for k, t in enumerate(g.ok):
                    t.reward = 3e38 if k % 2 else -3e38
        return {}

    return score


def _adapter_bytes(run_dir: Path, step: int) -> bytes:
    return (
        run_dir / "checkpoints" / f"step_{step:06d}" / "adapter" / "adapter_model.safetensors"
    ).read_bytes()


def test_a_nonfinite_step_is_skipped_by_default(peaked_model_dir, tmp_path, capsys):
    over = {
        "steps": 3,
        "validation__every": 0,
        "rollout__groups_per_step": 2,
        "algorithm__advantage": "dr_grpo",
    }
    run_dir = train(_config(peaked_model_dir, tmp_path / "run", **over), score=_overflow_at(2))
    rows = {r["step"]: r for r in _rows(run_dir) if "loss" in r}
    assert sorted(rows) == [1, 2, 3]
    assert [rows[s]["nonfinite_skipped"] for s in (1, 2, 3)] == [0.0, 1.0, 0.0]
    assert (
        rows[2]["loss"] is None and rows[2]["grad_norm"] is None
    )  # metrics.jsonl writes inf and NaN as null
    assert all(math.isfinite(rows[s]["loss"]) for s in (1, 3))
    lines = [line for line in capsys.readouterr().out.splitlines() if "not finite" in line]
    assert (
        len(lines) == 1
        and lines[0].startswith("step 2: loss")
        and 'skipped (optim.on_nonfinite = "skip")' in lines[0]
    )
    # step 2 changed nothing: its checkpoint holds step 1's adapter; step 3 trained again
    assert _adapter_bytes(run_dir, 2) == _adapter_bytes(run_dir, 1) != _adapter_bytes(run_dir, 3)


def test_a_nonfinite_step_stops_the_run_when_asked(peaked_model_dir, tmp_path):
    from grooves.training.step import NonFiniteStep

    over = {
        "steps": 3,
        "validation__every": 0,
        "rollout__groups_per_step": 2,
        "algorithm__advantage": "dr_grpo",
    }
    run_dir = tmp_path / "run"
    config = _config(peaked_model_dir, run_dir, optim__on_nonfinite="stop", **over)
    with pytest.raises(
        NonFiniteStep,
        match=r'^step 2: loss .* not finite; its update was not applied and the run stops \(optim.on_nonfinite = "stop"\)',
    ):
        train(config, score=_overflow_at(2))
    assert [r["step"] for r in _rows(run_dir) if "loss" in r] == [1]  # step 2 is neither logged
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000001"]  # nor checkpointed


def _files(run_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def test_a_new_run_in_a_folder_that_holds_one_is_refused_unless_told(peaked_model_dir, tmp_path):
    from grooves.config import ConfigError
    from grooves.training.runlog import RunFolderError

    out = tmp_path / "run"
    over = {"validation__every": 0, "rollout__groups_per_step": 4}
    train(_config(peaked_model_dir, out, steps=3, **over))
    before = _files(out)

    with pytest.raises(
        RunFolderError,
        match=r"already holds a run \(checkpoints up to step_000003\); continue it with --resume",
    ):
        train(_config(peaked_model_dir, out, steps=2, optim={"lr": 1e-3}, **over))
    with pytest.raises(
        ConfigError, match=r"^model.base_model: "
    ):  # a start that fails after the folder checks
        train(
            _config(peaked_model_dir, out, steps=2, model={"base_model": str(tmp_path / "gone")}, **over),
            overwrite=True,
        )
    assert _files(out) == before  # neither touched the old run: not its config.toml, not its checkpoints

    train(_config(peaked_model_dir, out, steps=2, **over), overwrite=True)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    assert [r["step"] for r in _rows(out)] == [0, 1, 2]
    assert sorted(p.name for p in (out / "samples").iterdir()) == [
        "step_000001.jsonl",
        "step_000002.jsonl",
        "validation_000000.jsonl",
        "validation_000002.jsonl",
    ]
    assert "steps = 2" in (out / "config.toml").read_text()


def test_a_second_trainer_on_a_locked_folder_is_refused(peaked_model_dir, tmp_path):
    import os

    from grooves.training.runlog import RunFolderError, lock_run_dir

    out = tmp_path / "run"
    with lock_run_dir(out):  # as a trainer in another process holds it
        with pytest.raises(RunFolderError, match=rf"is in use by another trainer \(process {os.getpid()}\)"):
            train(_config(peaked_model_dir, out, steps=1, validation__every=0))
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_resume_falls_back_from_a_damaged_checkpoint(peaked_model_dir, tmp_path, capsys):
    over = {"steps": 3, "validation__every": 0, "rollout__groups_per_step": 4}
    full = _rows(train(_config(peaked_model_dir, tmp_path / "full", **over)))
    part = tmp_path / "part"
    train(_config(peaked_model_dir, part, **over), stop_after=2)
    adapter = part / "checkpoints" / "step_000002" / "adapter" / "adapter_model.safetensors"
    size = adapter.stat().st_size
    adapter.write_bytes(adapter.read_bytes()[:1000])  # as a full disk or a cut copy leaves it
    capsys.readouterr()
    resumed = _rows(train(_config(peaked_model_dir, part, **over), resume=True))
    lines = [line for line in capsys.readouterr().err.splitlines() if "damaged" in line]
    assert lines == [
        f"checkpoint {part / 'checkpoints' / 'step_000002'} is damaged (adapter/adapter_model.safetensors has 1000 bytes, "
        f"the manifest says {size}); falling back to step_000001"
    ]
    assert [r["step"] for r in resumed] == [r["step"] for r in full] == [0, 1, 2, 3]
    assert_same_rows(full, resumed)  # step 2 was trained again, from step 1's checkpoint


def test_resume_falls_back_from_damage_the_manifest_leaves_out_or_a_load_finds(
    peaked_model_dir, tmp_path, capsys
):
    over = {"steps": 3, "validation__every": 0, "rollout__groups_per_step": 2, "rollout__group_size": 4}
    run = tmp_path / "run"
    train(_config(peaked_model_dir, run, **over), stop_after=2)
    two = run / "checkpoints" / "step_000002"
    manifest = json.loads((two / "manifest.json").read_text())
    del manifest["files"]["adapter/adapter_model.safetensors"]
    (two / "manifest.json").write_text(json.dumps(manifest))
    (two / "adapter" / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    capsys.readouterr()
    resumed = _rows(train(_config(peaked_model_dir, run, **over), resume=True))
    said = capsys.readouterr()
    assert [line for line in said.err.splitlines() if "step_000002" in line] == [
        f"checkpoint {two} is damaged (adapter/adapter_model.safetensors not listed in manifest.json); "
        "falling back to step_000001"
    ]
    assert f"resuming {run} from step 1 " in said.out
    assert [r["step"] for r in resumed if "loss" in r] == [1, 2, 3]

    # a checkpoint of the older format has no manifest: its damage shows only when it is loaded
    three = run / "checkpoints" / "step_000003"
    state = json.loads((three / "state.json").read_text())
    (three / "state.json").write_text(json.dumps({k: v for k, v in state.items() if k != "format"}))
    (three / "manifest.json").unlink()
    (three / "adapter" / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    resumed = _rows(train(_config(peaked_model_dir, run, **over), resume=True))
    said = capsys.readouterr()
    lines = [line for line in said.err.splitlines() if "step_000003" in line]
    assert len(lines) == 1 and lines[0].startswith(
        f"{three}: adapter/adapter_model.safetensors cannot be read (SafetensorError: "
    )
    assert lines[0].endswith("; falling back to step_000002")
    assert f"resuming {run} from step 2 " in said.out
    assert [r["step"] for r in resumed if "loss" in r] == [1, 2, 3]


def test_ctrl_c_stops_with_one_line_and_resume_continues(peaked_model_dir, tmp_path):
    """SIGINT to `grooves train`: exit 130, no crash, one line with the step and the --resume command."""
    out = tmp_path / "run"
    config = _config(peaked_model_dir, out, steps=60, validation__every=0, **SMALL_STEP)
    run_file = tmp_path / "run.toml"
    run_file.write_text(_toml(config))
    cmd = [sys.executable, "-m", "grooves.cli", "train", str(run_file)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # a shell's background job (`make test &`, a CI runner) starts with SIGINT ignored, and an
        # ignored signal stays ignored across exec: give the run a terminal's default Ctrl-C
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 240
    while not (out / "checkpoints" / "step_000002" / "manifest.json").exists():
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.time() < deadline
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C does: to the whole process group
    stderr = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, stderr[-2000:]
    assert "terminate called" not in stderr and "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    done = max(r["step"] for r in _rows(out) if "loss" in r)
    checkpoint = json.loads((out / "checkpoints" / f"step_{done:06d}" / "state.json").read_text())["step"]
    assert checkpoint == done >= 2  # checkpoint_every = 1: the last step logged is the last checkpoint
    assert last == (
        f"interrupted after step {done} of 60; the last checkpoint is step {done} ({out / 'checkpoints' / f'step_{done:06d}'}); "
        f"continue with: grooves train {run_file} --resume"
    )
    result = subprocess.run(
        [*cmd, "--resume", "--set", f"steps={done + 1}"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert [r["step"] for r in _rows(out) if "loss" in r] == list(range(1, done + 2))


class _SwallowsCancel(ToyTokensTask):
    """At step 3 one rollout cancels the run's main task, then swallows the CancelledError that
    reaches it and returns normally, as a library call that catches cancellation might."""

    def __init__(self, per_step: int, **options):
        super().__init__(**options)
        self.per_step = per_step
        self.training_rollouts = 0

    async def rollout(self, model, scenario):
        import asyncio

        traj = await super().rollout(model, scenario)
        if model.temperature == 1.0:  # training's; validation samples at 0.7
            self.training_rollouts += 1
        if self.training_rollouts == 2 * self.per_step + 1:  # the first of step 3
            self.training_rollouts += 1
            main = next(t for t in asyncio.all_tasks() if t.get_coro().__name__ == "run")
            main.cancel()
            try:
                await asyncio.sleep(0.2)  # the cancellation arrives here, through the awaiting tasks
            except asyncio.CancelledError:
                pass
        return traj


def test_a_cancellation_a_rollout_swallows_still_stops_the_run_at_the_next_step(peaked_model_dir, tmp_path):
    import asyncio

    out = tmp_path / "run"
    config = _config(peaked_model_dir, out, steps=8, validation__every=0, rollout__concurrency=1)
    with pytest.raises(asyncio.CancelledError):
        train(config, task=_SwallowsCancel(per_step=8 * 8, vocab_size=487, num_scenarios=16))
    assert max(r["step"] for r in _rows(out) if "loss" in r) == 3  # step 3 finished, step 4 never began


OVERFLOW_TASK = """
from grooves.tasks.toy import ToyTokensTask


class OverflowTask(ToyTokensTask):
    async def rollout(self, model, scenario):
        traj = await super().rollout(model, scenario)
        traj.reward = 3e38 if traj.turns[-1].token_ids[0] % 2 else -3e38  # the loss overflows float32
        return traj
"""


def test_the_cli_ends_a_run_stopped_by_a_nonfinite_step_with_one_line(
    peaked_model_dir, tmp_path, monkeypatch
):
    import tomli_w
    from typer.testing import CliRunner

    from grooves.cli import app as cli_app

    (tmp_path / "overflow_task.py").write_text(OVERFLOW_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = _config(
        peaked_model_dir,
        tmp_path / "run",
        steps=2,
        validation__every=0,
        optim__on_nonfinite="stop",
        algorithm__advantage="dr_grpo",
    )
    data = config.model_dump(mode="json", exclude_none=True)
    data["task"], data["task_options"] = (
        "overflow_task:OverflowTask",
        {"vocab_size": 487, "num_scenarios": 16},
    )
    run_file = tmp_path / "run.toml"
    run_file.write_text(tomli_w.dumps(data))
    result = CliRunner().invoke(cli_app, ["train", str(run_file)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if "not finite" in line]
    assert len(lines) == 1 and lines[0].startswith(f"{run_file}: step 1: loss") and "--resume" in lines[0], (
        result.output
    )


class _NoSuccess(ToyTokensTask):
    name = "no_success"

    async def rollout(self, model, scenario):
        traj = await super().rollout(model, scenario)
        del traj.metrics["success"]
        return traj


def test_a_task_that_never_sets_success_is_named_once(peaked_model_dir, tmp_path, capsys):
    config = _config(peaked_model_dir, tmp_path / "run", steps=2, validation__every=1)
    train(config, task=_NoSuccess(vocab_size=487, num_scenarios=16))
    lines = [line for line in capsys.readouterr().err.splitlines() if "success" in line]
    assert lines == [
        "task 'no_success' sets no traj.metrics[\"success\"]: success_rate counts every rollout as 0, "
        "--select best too; set it in the rollout (1.0 solved, 0.0 not)"
    ]
    capsys.readouterr()
    train(
        _config(peaked_model_dir, tmp_path / "set", steps=1),
        task=ToyTokensTask(vocab_size=487, num_scenarios=16),
    )
    assert "success" not in capsys.readouterr().err  # a task that sets it hears nothing


def test_train_step_takes_turns_of_the_live_adapter_or_at_most_rollout_max_staleness_before_it(
    policy, peaked_model_dir, tmp_path
):
    """The one step of the loop and the service: a turn more than `rollout.max_staleness` versions
    behind the live adapter is refused before any update; within it, the lags are in the stats."""
    import torch

    from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup
    from grooves.training.step import run_loss, train_step

    def group(*versions):  # one turn per rollout, rewards 0, 1, 0, ...: not a zero-variance group
        return TrajectoryGroup(
            trajectories=[
                Trajectory(
                    turns=[
                        SampledTurn(
                            prompt_token_ids=[1, 30, 2],
                            token_ids=[40, 41],
                            logprobs=[0.0, 0.0],
                            adapter_version=v,
                        )
                    ],
                    reward=float(i % 2),
                )
                for i, v in enumerate(versions)
            ]
        )

    live, before = policy.adapters.version, _trainable(policy)
    optimizer = torch.optim.SGD([p for p in policy.model.parameters() if p.requires_grad], lr=0.0)
    try:
        policy.adapters.version = 5
        strict = _config(peaked_model_dir, tmp_path)
        with pytest.raises(
            ValueError,
            match=r"versions \[4\], but the live adapter is 5 and rollout.max_staleness = 0 allows 5$",
        ):
            train_step(policy, optimizer, [group(5, 4)], strict, run_loss(strict))
        assert policy.adapters.version == 5  # refused before the update
        loose = _config(peaked_model_dir, tmp_path, rollout__max_staleness=2)
        with pytest.raises(ValueError, match=r"versions \[2, 6\], .* allows 3\.\.5$"):
            train_step(policy, optimizer, [group(2, 3), group(6, 5)], loose, run_loss(loose))
        stats, seqs = train_step(policy, optimizer, [group(5, 3, None, 4)], loose, run_loss(loose))
        assert policy.adapters.version == 6 and len(seqs) == 4
        # lags 0, 2, 1 (a turn without a version was not sampled by the policy)
        assert stats["staleness_mean"] == 1.0 and stats["staleness_max"] == 2.0
        assert [stats[f"staleness/{j}"] for j in range(3)] == pytest.approx([1 / 3] * 3)
    finally:
        _restore(policy, before)
        policy.adapters.version = live


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_run_on_cuda_samples_and_trains_there(peaked_model_dir, tmp_path):
    """The sampler's per-row settings and the trainer's batches must live on the model's device:
    on a GPU, tensors left on the CPU stop the first step."""
    run_dir = train(_config(peaked_model_dir, tmp_path / "cuda", steps=2, model__device="cuda"))
    rows = [r for r in _rows(run_dir) if r.get("reward_mean") is not None]
    assert [r["adapter_version"] for r in rows] == [1, 2]
    assert max(r["mismatch_k3_mean"] for r in rows) < 1e-3


def test_validation_at_start_false_scores_only_after_the_last_step(tiny_model_dir, tmp_path):
    config = _config(
        tiny_model_dir, tmp_path / "run", steps=2, validation__every=0, validation__at_start=False
    )
    validated = [r["step"] for r in _rows(train(config)) if "val/reward_mean" in r]
    assert validated == [2]
    default = _config(tiny_model_dir, tmp_path / "default", steps=2, validation__every=0)
    assert [r["step"] for r in _rows(train(default)) if "val/reward_mean" in r] == [0, 2]


def test_validation_max_tokens_bounds_validation_turns_and_not_training_ones(tiny_model_dir, tmp_path):
    """`validation.max_tokens` is validation's own budget; unset, validation uses `rollout.max_tokens`."""

    def lengths(path: Path) -> list[int]:
        groups = [json.loads(line) for line in path.read_text().splitlines()]
        return [len(turn["token_ids"]) for g in groups for t in g["trajectories"] for turn in t["turns"]]

    config = _config(tiny_model_dir, tmp_path / "run", steps=1, validation__every=0, validation__max_tokens=1)
    run_dir = train(config)
    validation = lengths(run_dir / "samples" / "validation_000001.jsonl")
    training = lengths(run_dir / "samples" / "step_000001.jsonl")
    assert len(validation) == 8 and max(validation) == 1
    assert len(training) == 64 and max(training) == 4  # rollout.max_tokens
    default = train(_config(tiny_model_dir, tmp_path / "default", steps=1, validation__every=0))
    assert max(lengths(default / "samples" / "validation_000001.jsonl")) == 4
