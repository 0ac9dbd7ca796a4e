"""Trajectories to sequences (masks listed by hand), padding and packing."""

from __future__ import annotations

import pytest
import torch

from grooves.core.loss import compute_loss
from grooves.core.tokenize import (
    TrainSequence,
    check_mask_shape,
    pack_batches,
    pad_batch,
    prefix_breaks,
    trajectory_to_sequences,
)
from grooves.core.trajectory import SampledTurn, Trajectory

NEG = torch.finfo(torch.float32).min


def _tool_trajectory() -> Trajectory:
    """system+user [1,2,3] -> tool call [10,11,12] -> tool result [20,21] -> answer [13,14] -> user [30,31,32] -> [15]."""
    t0 = SampledTurn(prompt_token_ids=[1, 2, 3], token_ids=[10, 11, 12], logprobs=[-0.1, -0.2, -0.3])
    t1 = SampledTurn(
        prompt_token_ids=[1, 2, 3, 10, 11, 12, 20, 21], token_ids=[13, 14], logprobs=[-0.4, -0.5]
    )
    t2 = SampledTurn(
        prompt_token_ids=[1, 2, 3, 10, 11, 12, 20, 21, 13, 14, 30, 31, 32], token_ids=[15], logprobs=[-0.6]
    )
    return Trajectory(turns=[t0, t1, t2], reward=1.0)


def test_append_only_multi_turn_is_one_sequence_with_exact_mask():
    (seq,) = trajectory_to_sequences(_tool_trajectory(), 0.5, group_id=7)
    assert seq.input_ids == [1, 2, 3, 10, 11, 12, 20, 21, 13, 14, 30, 31, 32, 15]
    sampled_positions = [i for i, m in enumerate(seq.sampled_mask) if m]
    assert sampled_positions == [3, 4, 5, 8, 9, 13]
    assert seq.old_logprobs == [0, 0, 0, -0.1, -0.2, -0.3, 0, 0, -0.4, -0.5, 0, 0, 0, -0.6]
    assert (seq.advantage, seq.group_id, seq.prompt_len, seq.num_sampled) == (0.5, 7, 3, 6)
    assert prefix_breaks(_tool_trajectory()) == 0


def test_each_sampled_token_carries_its_turns_temperature():
    traj = _tool_trajectory()
    traj.turns[0].temperature, traj.turns[1].temperature, traj.turns[2].temperature = 0.5, 0.0, 1.25
    (seq,) = trajectory_to_sequences(traj, 1.0)
    # context at 1; the greedy turn (0) reports temperature-1 logprobs, so it is read at 1
    assert seq.temperatures == [1, 1, 1, 0.5, 0.5, 0.5, 1, 1, 1.0, 1.0, 1, 1, 1, 1.25]
    packed = pack_batches([seq, _seq([5, 6, 7], 1)], max_tokens=32)[0]
    assert packed.temperatures.tolist() == [[*seq.temperatures, 1, 1, 1]]  # None: 1 everywhere


def test_non_append_only_template_starts_a_new_sequence():
    traj = _tool_trajectory()
    # turn 1's template drops the earlier completion except its last token (like stripping <think>)
    traj.turns[1] = SampledTurn(
        prompt_token_ids=[1, 2, 3, 12, 20, 21], token_ids=[13, 14], logprobs=[-0.4, -0.5]
    )
    traj.turns[2] = SampledTurn(
        prompt_token_ids=[1, 2, 3, 12, 20, 21, 13, 14, 30], token_ids=[15], logprobs=[-0.6]
    )
    first, second = trajectory_to_sequences(traj, -1.0)
    assert first.input_ids == [1, 2, 3, 10, 11, 12]
    assert [i for i, m in enumerate(first.sampled_mask) if m] == [3, 4, 5]
    assert first.prompt_len == 3
    assert second.input_ids == [1, 2, 3, 12, 20, 21, 13, 14, 30, 15]
    assert [i for i, m in enumerate(second.sampled_mask) if m] == [6, 7, 9]
    assert second.old_logprobs[6:] == [-0.4, -0.5, 0.0, -0.6]
    assert second.prompt_len == 6 and second.advantage == -1.0
    assert prefix_breaks(traj) == 1


def test_mask_shape_error_is_readable():
    bad = SampledTurn(prompt_token_ids=[1], token_ids=[5, 6, 7], logprobs=[-0.1, -0.2])
    with pytest.raises(ValueError, match="turn 1: 3 token_ids but 2 logprobs"):
        check_mask_shape(bad, 1)
    traj = _tool_trajectory()
    traj.turns[2] = bad
    with pytest.raises(ValueError, match="turn 2: 3 token_ids but 2 logprobs"):
        trajectory_to_sequences(traj, 1.0)


def test_failed_trajectory_is_refused():
    with pytest.raises(ValueError, match="failed rollouts are not trained on"):
        trajectory_to_sequences(Trajectory(error="TimeoutError"), 1.0)


def _seq(ids, sampled_from, adv=1.0):
    n = len(ids)
    mask = [i >= sampled_from for i in range(n)]
    return TrainSequence(
        ids, mask, [-0.1 * i if m else 0.0 for i, m in enumerate(mask)], adv, 0, sampled_from
    )


def test_pad_batch_layout():
    batch = pad_batch([_seq([5, 6, 7], 1, adv=2.0), _seq([8, 9, 10, 11, 12], 3, adv=-1.0)], pad_token_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    assert batch.seq_ids.tolist() == [[0, 0, 0, -1, -1], [1, 1, 1, 1, 1]]
    assert batch.sampled_mask.tolist() == [
        [False, True, True, False, False],
        [False, False, False, True, True],
    ]
    assert batch.advantages.tolist() == [[2, 2, 2, 0, 0], [-1, -1, -1, -1, -1]]
    torch.testing.assert_close(batch.old_logprobs[1], torch.tensor([0, 0, 0, -0.3, -0.4]))
    assert (batch.num_sequences, batch.num_sampled_tokens, batch.sequence_index) == (2, 4, (0, 1))


def test_pack_batches_first_fit_and_block_mask():
    seqs = [_seq([1, 2, 3], 1), _seq([4, 5, 6, 7, 8], 2), _seq([9, 10], 1)]
    batches = pack_batches(seqs, max_tokens=8)
    assert len(batches) == 2
    b0, b1 = batches
    assert b0.input_ids.tolist() == [[4, 5, 6, 7, 8, 1, 2, 3]]
    assert b0.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2]]
    assert b0.seq_ids.tolist() == [[0, 0, 0, 0, 0, 1, 1, 1]]
    assert b0.sequence_index == (1, 0) and b1.sequence_index == (2,)
    m = b0.attention_mask
    assert m.shape == (1, 1, 8, 8) and m.dtype == torch.float32
    allowed = (m[0, 0] == 0).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1, 1, 1],
    ]
    assert set(m.unique().tolist()) == {0.0, NEG}


def test_pack_batches_rows_per_batch_pads_and_padding_sees_itself():
    seqs = [_seq([1, 2, 3], 1), _seq([4, 5, 6, 7, 8], 2), _seq([9, 10], 1)]
    (batch,) = pack_batches(seqs, max_tokens=8, rows_per_batch=2)
    assert batch.input_ids.shape == (2, 8) and batch.num_sequences == 3
    assert batch.seq_ids[1].tolist() == [2, 2, -1, -1, -1, -1, -1, -1]
    allowed = batch.attention_mask[1, 0] == 0
    assert allowed[3].tolist() == [False, False, False, True, False, False, False, False]
    assert allowed[1].tolist() == [True, True] + [False] * 6
    assert batch.advantages[1, 2:].abs().sum() == 0 and not batch.sampled_mask[1, 2:].any()


def test_long_sequence_gets_its_own_row():
    seqs = [_seq(list(range(1, 11)), 2), _seq([1, 2], 1), _seq([3, 4], 1)]
    batches = pack_batches(seqs, max_tokens=6)
    assert [b.input_ids.shape[1] for b in batches] == [10, 4]
    assert batches[1].sequence_index == (1, 2)
    with pytest.raises(ValueError, match="max_tokens and rows_per_batch must be >= 1"):
        pack_batches(seqs, max_tokens=0)


@pytest.mark.parametrize("policy_loss", ["ppo", "cispo", "gspo"])
@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "constant"])
def test_pad_and_pack_give_the_same_loss(policy_loss, aggregation):
    g = torch.Generator().manual_seed(0)
    seqs = []
    for k, n in enumerate([7, 4, 9, 3, 6]):
        ids = torch.randint(1, 50, (n,), generator=g).tolist()
        seq = _seq(ids, 2, adv=[1.0, -0.5, 0.25, -1.0, 0.75][k])
        old = [
            x - 0.05 * (k + 1) if m else 0.0 for x, m in zip(seq.old_logprobs, seq.sampled_mask, strict=True)
        ]
        seqs.append(TrainSequence(seq.input_ids, seq.sampled_mask, old, seq.advantage, 0, 2))

    def loss_of(batch, num_sequences, num_tokens):
        # a current logprob that depends only on the token and its position, whatever the layout
        lp = -0.02 * batch.input_ids.float() - 0.01 * batch.position_ids.float()
        out, _ = compute_loss(
            lp,
            batch.old_logprobs,
            batch.advantages,
            batch.sampled_mask,
            batch.seq_ids,
            policy_loss=policy_loss,
            eps_low=0.2,
            eps_high=0.28,
            aggregation=aggregation,
            max_completion_tokens=8,
            num_sequences=num_sequences,
            num_tokens=num_tokens,
        )
        return out.item()

    padded = pad_batch(seqs)
    whole = loss_of(padded, None, None)
    packed = pack_batches(seqs, max_tokens=12)
    assert len(packed) > 1
    split = sum(loss_of(b, padded.num_sequences, padded.num_sampled_tokens) for b in packed)
    assert split == pytest.approx(whole, abs=1e-6)
    assert whole != 0.0
