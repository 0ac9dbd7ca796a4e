"""Truncated importance sampling of stale turns: the trainer's old logprobs are those under the
adapter version that sampled each turn, not the live adapter's."""

from __future__ import annotations

import math

import pytest
import torch

from grooves.config import LoraConfig, parse_config
from grooves.core.forward import token_logprobs
from grooves.core.loss import POLICY_LOSSES
from grooves.core.tokenize import pad_batch, trajectory_to_sequences
from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup
from grooves.policy.transformers import TransformersPolicy
from grooves.training.old_policy import AdapterHistory
from grooves.training.step import needs_history, run_loss, train_step

PROMPT, TOKENS = [1, 30, 2], [40, 41, 42, 43]


def _config(model_dir, tmp_path, **rollout):
    return parse_config(
        {
            "name": "tis",
            "output_dir": str(tmp_path),
            "task": "toy_tokens",
            "model": {"base_model": str(model_dir)},
            "rollout": {"group_size": 4, "groups_per_step": 1, "max_tokens": 4, **rollout},
            "algorithm": {"tis_cap": 2.0, "eps_low": 0.2, "eps_high": 0.2, "aggregation": "token_mean"},
            "lora": {"rank": 4, "alpha": 8},
            "logging": {"progress": False, "report": False},
        }
    )


def _trainer_logprobs(policy, seqs) -> torch.Tensor:
    with torch.no_grad():
        return token_logprobs(policy.model, pad_batch(seqs))[0]  # [B, T]


def _group(policy, version: int, shift: float) -> TrajectoryGroup:
    """Rollouts of version `version` whose sampler logprobs are the trainer's (now) minus `shift`:
    a sampler that is not the trainer's function."""
    trajs = []
    for i in range(4):
        ids = TOKENS[i:] + TOKENS[:i]
        turn = SampledTurn(
            prompt_token_ids=PROMPT, token_ids=ids, logprobs=[0.0] * 4, adapter_version=version
        )
        trajs.append(Trajectory(turns=[turn], reward=float(i % 2)))
    seqs = [s for t in trajs for s in trajectory_to_sequences(t, 0.0)]
    lp = _trainer_logprobs(policy, seqs)
    for t, row in zip(trajs, lp, strict=True):
        t.turns[0].logprobs = [v - shift for v in row[len(PROMPT) :].tolist()]
    return TrajectoryGroup(trajectories=trajs)


def test_a_stale_turns_weight_and_ratio_are_taken_against_the_adapter_that_sampled_it(
    peaked_model_dir, tmp_path
):
    torch.manual_seed(0)
    policy = TransformersPolicy(
        str(peaked_model_dir), lora=LoraConfig(rank=4, alpha=8), seed=0, served_name="t"
    )
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    config = _config(peaked_model_dir, tmp_path, max_staleness=1)
    assert needs_history(config)
    history = AdapterHistory(config.rollout.max_staleness)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=2.0)  # a large step: version 1's ratios leave the clip range
    group = _group(policy, version=0, shift=0.3)
    seqs = [s for t in group.ok for s in trajectory_to_sequences(t, 0.0)]
    lp_v0 = _trainer_logprobs(policy, seqs)  # [B, T]
    train_step(policy, optimizer, [group], config, run_loss(config), history=history)  # on-policy: v0 -> v1
    assert history.versions == [0]
    lp_v1 = _trainer_logprobs(policy, seqs)

    stats, trained = train_step(policy, optimizer, [group], config, run_loss(config), history=history)

    batch = pad_batch(trained)
    mask = batch.sampled_mask
    # the formula: w = min(pi_v0 / pi_sampler, 2) = e^0.3 on every token; rho = pi_v1 / pi_v0, clipped
    assert stats["tis_weight_mean"] == pytest.approx(math.exp(0.3), rel=1e-4)
    clipped = POLICY_LOSSES["ppo"](
        lp_v1, lp_v0, batch.advantages, mask, batch.seq_ids, eps_low=0.2, eps_high=0.2
    ).clipped
    expected_clip = float(clipped[mask].float().mean())
    assert expected_clip > 0.1  # the step moved the policy enough to clip: the check can tell
    assert stats["clip_fraction"] == pytest.approx(expected_clip)
    assert stats["ratio_mean"] == pytest.approx(
        float(torch.exp(lp_v1 - batch.old_logprobs)[mask].mean()), rel=1e-4
    )
    assert history.versions == [0, 1]  # v0 and v1; v2 is live now

    fresh = AdapterHistory(1)  # a restarted trainer: the weights that sampled version 0 are gone
    policy.adapters.version = 1
    with pytest.raises(
        ValueError, match=r"adapter versions \[0\], whose weights this trainer no longer holds"
    ):
        train_step(policy, optimizer, [group], config, run_loss(config), history=fresh)
    assert policy.adapters.version == 1


def test_history_keeps_the_versions_a_step_can_take_and_reads_a_saved_adapter(peaked_model_dir, tmp_path):
    torch.manual_seed(0)
    policy = TransformersPolicy(str(peaked_model_dir), lora=LoraConfig(rank=4, alpha=8), seed=0)
    history = AdapterHistory(2)
    a = next(p for n, p in policy.model.named_parameters() if "lora_A" in n)
    for version in range(5):
        with torch.no_grad():
            a.fill_(float(version))
        history.record(policy.model, version)
    assert history.versions == [2, 3, 4]  # live 4 takes turns of 2..4
    policy.model.save_pretrained(str(tmp_path / "v4"))
    history.load(9, tmp_path / "v4")
    with history.weights(policy.model, 2):
        assert torch.all(a == 2.0)
    assert torch.all(a == 4.0)  # back to the live weights
    with history.weights(policy.model, 9):
        assert torch.all(a == 4.0)


def test_turns_without_a_version_are_refused_where_each_turns_version_is_needed(peaked_model_dir, tmp_path):
    """Under truncated importance sampling with rollouts ahead of the trainer, a turn that records no
    adapter version might be stale: its old logprobs cannot be taken, so the step refuses it before
    changing anything (not the live adapter's logprobs, silently)."""
    policy = TransformersPolicy(
        str(peaked_model_dir), lora=LoraConfig(rank=4, alpha=8), seed=0, served_name="t"
    )
    config = _config(peaked_model_dir, tmp_path, max_staleness=1)
    history = AdapterHistory(config.rollout.max_staleness)
    optimizer = torch.optim.SGD([p for p in policy.model.parameters() if p.requires_grad], lr=2.0)
    group = _group(policy, version=0, shift=0.0)
    group.trajectories[1].turns[0].adapter_version = None
    with pytest.raises(
        ValueError,
        match=r"turns without an adapter_version: algorithm.tis_cap with "
        r"rollout.max_staleness = 1 .* or set rollout.max_staleness = 0",
    ):
        train_step(policy, optimizer, [group], config, run_loss(config), history=history)
    assert policy.adapters.version == 0 and history.versions == []


def test_stale_turns_under_tis_without_a_history_are_refused(peaked_model_dir, tmp_path):
    """`train_step` with algorithm.tis_cap and turns of an earlier version, but no `history`: the old
    logprobs of those turns cannot be taken under the weights that sampled them, and the live
    adapter's (ratio 1, never clipped) would be wrong, so the step refuses before changing anything."""
    policy = TransformersPolicy(
        str(peaked_model_dir), lora=LoraConfig(rank=4, alpha=8), seed=0, served_name="t"
    )
    config = _config(peaked_model_dir, tmp_path, max_staleness=1)
    optimizer = torch.optim.SGD([p for p in policy.model.parameters() if p.requires_grad], lr=2.0)
    group = _group(policy, version=0, shift=0.0)
    policy.adapters.version = 1  # the turns are one version behind the live adapter
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    with pytest.raises(
        ValueError,
        match=r"turns sampled by adapter versions \[0\] \(the live adapter is 1\) under algorithm.tis_cap "
        r"need the trainer's logprobs under those versions' weights: pass train_step an AdapterHistory",
    ):
        train_step(policy, optimizer, [group], config, run_loss(config))
    assert policy.adapters.version == 1
    assert all(torch.equal(p, before[n]) for n, p in policy.model.named_parameters() if n in before)
