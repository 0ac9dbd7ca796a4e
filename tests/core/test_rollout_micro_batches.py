"""Micro-batches keep the token sequences of one rollout together, so the loss sees each rollout whole."""

from __future__ import annotations

import math

import pytest
import torch

from grooves.config import AdamWConfig
from grooves.core.batching import micro_batches
from grooves.core.loss import Loss
from grooves.core.tokenize import trajectory_to_sequences
from grooves.core.trajectory import SampledTurn, Trajectory
from grooves.training.step import step_counts

SYSTEM = list(range(1, 10))  # 9 ids every rollout starts with: worth sharing (>= MIN_SHARED_PREFIX)


def _turn(extra: int, log_rhos: list[float]) -> SampledTurn:
    """A turn whose sampling logprobs are -1 - log rho_t, so that with every current logprob at -1
    each token's ratio is rho_t in any batch layout."""
    ids = [100 + i for i in range(len(log_rhos))]
    return SampledTurn(
        prompt_token_ids=[*SYSTEM, extra], token_ids=ids, logprobs=[-1.0 - r for r in log_rhos]
    )


def _step():
    """Rollout 0 (A = +1) is split by a prefix break into 1 + 3 sampled tokens with rho = e^0.4, 1, 1, 1;
    rollouts 1 and 2 (A = -1, +0.5) are whole, rho = 1."""
    trajs = [
        Trajectory(turns=[_turn(50, [0.4]), _turn(51, [0.0, 0.0, 0.0])]),
        Trajectory(turns=[_turn(52, [0.0, 0.0])]),
        Trajectory(turns=[_turn(53, [0.0])]),
    ]
    advantages = [1.0, -1.0, 0.5]
    return [s for t, a in zip(trajs, advantages, strict=True) for s in trajectory_to_sequences(t, a)]


@pytest.mark.parametrize(
    ("share_prefix", "packing"),
    [(True, False), (False, True), (False, False)],
    ids=["shared", "packed", "padded"],
)
def test_a_rollouts_token_sequences_share_a_micro_batch(share_prefix, packing):
    """With a budget of one sequence per micro-batch, rollout 0's two sequences still go together,
    and GSPO's per-rollout loss summed over the micro-batches is the hand-computed one:
    mean over rollouts of -min(s A, clip(s) A) = (-e^0.1 + 1 - 0.5) / 3 (e^0.1 inside [0.8, 1.2])."""
    seqs = _step()
    opt = AdamWConfig(micro_batch_tokens=16, share_prefix=share_prefix, packing=packing)
    batches = micro_batches(seqs, opt, 0)
    assert len(batches) >= 2  # the others are split up: the budget binds
    # rollout 0's two sequences are the ones whose prompts end in 50 and 51
    holding = [{50, 51} & set(b.input_ids.flatten().tolist()) for b, _ in batches]
    assert sorted(holding, key=len)[-1] == {50, 51} and sum(map(bool, holding)) == 1
    loss_fn = Loss("gspo", 0.2, 0.2, "sequence_mean", max_completion_tokens=4)
    counts = step_counts(seqs)
    total = 0.0
    for batch, _ in batches:
        lp = torch.where(batch.sampled_mask, -1.0, 0.0)  # [B, T]
        loss, _ = loss_fn(
            lp, batch.old_logprobs, batch.advantages, batch.sampled_mask, batch.rollout_ids, counts=counts
        )
        total += float(loss)
    assert total == pytest.approx((-math.exp(0.1) + 1.0 - 0.5) / 3, abs=1e-6)
