"""Policy losses, KL and aggregation against hand-computed values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from grooves.config import AlgorithmConfig
from grooves.core.loss import (
    POLICY_LOSSES,
    Loss,
    StepCounts,
    aggregate,
    build_loss,
    cispo,
    compute_loss,
    gspo,
    kl_penalty,
    ppo_clip,
    tis_weight,
)

LOG = math.log


def _ratio_case():
    """Two sequences, three sampled tokens each (+ one masked token with a huge log ratio).

    Row 0 has A = +1, row 1 has A = -1; token ratios are 1.5, 0.5, 1.1 in both rows.
    """
    lp_old = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-1.0, -2.0, -0.5, -3.0]])
    log_rho = torch.tensor([[LOG(1.5), LOG(0.5), LOG(1.1), 100.0], [LOG(1.5), LOG(0.5), LOG(1.1), 100.0]])
    lp = (lp_old + log_rho).requires_grad_(True)
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4])
    mask = torch.tensor([[True, True, True, False], [True, True, True, False]])
    seq_ids = torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]])
    return lp, lp_old, adv, mask, seq_ids


def test_ppo_clip_values_and_clipped_flags():
    lp, lp_old, adv, mask, seq_ids = _ratio_case()
    out = ppo_clip(lp, lp_old, adv, mask, seq_ids, eps_low=0.2, eps_high=0.28)
    # A=+1: -min(1.5, 1.28), -min(0.5, 0.8), -min(1.1, 1.1); A=-1: -min(-1.5, -1.28), -min(-0.5, -0.8), 1.1
    expected = torch.tensor([[-1.28, -0.5, -1.1, 0.0], [1.5, 0.8, 1.1, 0.0]])
    torch.testing.assert_close(out.loss, expected)
    assert out.clipped.tolist() == [[True, False, False, False], [False, True, False, False]]


def test_ppo_clip_zero_grad_where_clipped_term_is_min():
    lp, lp_old, adv, mask, seq_ids = _ratio_case()
    out = ppo_clip(lp, lp_old, adv, mask, seq_ids, eps_low=0.2, eps_high=0.28)
    out.loss.sum().backward()
    # d/dlp of -rho*A is -rho*A where unclipped; 0 where clipped (A>0, rho>1.28 and A<0, rho<0.8) and off-mask
    expected = torch.tensor([[0.0, -0.5, -1.1, 0.0], [1.5, 0.0, 1.1, 0.0]])
    torch.testing.assert_close(lp.grad, expected)


def test_cispo_values_and_every_token_keeps_grad():
    lp, lp_old, adv, mask, seq_ids = _ratio_case()
    out = cispo(lp, lp_old, adv, mask, seq_ids, eps_low=0.2, eps_high=0.28)
    w = torch.tensor([[1.28, 0.8, 1.1, 0.0], [1.28, 0.8, 1.1, 0.0]])  # sg(clip(rho))
    torch.testing.assert_close(out.loss, torch.where(mask, -w * adv * lp.detach(), torch.zeros(())))
    assert out.clipped.tolist() == [[True, True, False, False], [True, True, False, False]]
    total = aggregate(out.loss, mask, seq_ids, "token_mean", max_completion_tokens=4)
    total.backward()
    # grad = -sg(w) * A / 6 on every sampled token, clipped ones included; no term from d(w)/d(lp)
    torch.testing.assert_close(lp.grad, -w * adv / 6)
    assert (lp.grad[mask] != 0).all()


def _gspo_case():
    """Three sequences: ratios [2, 0.5, 1] (s=1, A=+1), [4, 1] (s=2, A=-0.5), [1.5, 1.5] (s=1.5, A=+1)."""
    lp_old = torch.full((3, 3), -1.0)
    log_rho = torch.tensor([[LOG(2), LOG(0.5), 0.0], [LOG(4), 0.0, 50.0], [LOG(1.5), LOG(1.5), 50.0]])
    lp = (lp_old + log_rho).requires_grad_(True)
    adv = torch.tensor([[1.0] * 3, [-0.5] * 3, [1.0] * 3])
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, False]])
    seq_ids = torch.tensor([[0, 0, 0], [1, 1, -1], [2, 2, -1]])
    return lp, lp_old, adv, mask, seq_ids


def test_gspo_sequence_ratio_is_geometric_mean():
    lp, lp_old, adv, mask, seq_ids = _gspo_case()
    out = gspo(lp, lp_old, adv, mask, seq_ids, eps_low=3e-4, eps_high=4e-4)
    # s = (2*0.5*1)^(1/3) = 1 -> -1; s = (4*1)^(1/2) = 2, A<0 -> -min(-1, -0.5002) = 1; s=1.5 clipped -> -1.0004
    expected = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 0.0], [-1.0004, -1.0004, 0.0]])
    torch.testing.assert_close(out.loss, expected)
    assert out.clipped.tolist() == [[False] * 3, [False] * 3, [True, True, False]]


def test_gspo_gradient_with_sequence_mean():
    lp, lp_old, adv, mask, seq_ids = _gspo_case()
    out = gspo(lp, lp_old, adv, mask, seq_ids, eps_low=3e-4, eps_high=4e-4)
    aggregate(out.loss, mask, seq_ids, "sequence_mean", max_completion_tokens=3).backward()
    # d l_i / d lp_t = -A_i s_i / |y_i|, then / 3 sequences; the clipped sequence gets 0
    expected = torch.tensor([[-1 / 9, -1 / 9, -1 / 9], [1 / 6, 1 / 6, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(lp.grad, expected)


def test_gspo_packed_row_equals_padded_rows():
    lp, lp_old, adv, mask, seq_ids = _gspo_case()
    keep = mask | (seq_ids >= 0)
    packed = [t[keep][None] for t in (lp.detach(), lp_old, adv, mask, seq_ids)]  # one row of 7 tokens
    padded = gspo(lp.detach(), lp_old, adv, mask, seq_ids, eps_low=3e-4, eps_high=4e-4).loss
    row = gspo(*packed, eps_low=3e-4, eps_high=4e-4).loss
    torch.testing.assert_close(row[0], padded[keep])


def test_policy_losses_share_one_signature():
    lp, lp_old, adv, mask, seq_ids = _ratio_case()
    for name, fn in POLICY_LOSSES.items():
        out = fn(lp, lp_old, adv, mask, seq_ids, eps_low=0.2, eps_high=0.28)
        assert out.loss.shape == out.clipped.shape == mask.shape, name
        assert out.clipped.dtype == torch.bool
        assert (out.loss[~mask] == 0).all() and torch.isfinite(out.loss).all(), name


def test_kl_k1_k3_values():
    lp = torch.tensor([LOG(0.5), LOG(0.5)])
    lp_ref = torch.tensor([LOG(0.25), LOG(1.0)])
    # d = log 0.5, log 2
    torch.testing.assert_close(kl_penalty(lp, lp_ref, "k1"), torch.tensor([LOG(2), -LOG(2)]))
    torch.testing.assert_close(
        kl_penalty(lp, lp_ref, "k3"), torch.tensor([0.5 - LOG(0.5) - 1, 2 - LOG(2) - 1])
    )


def test_k3_nonnegative_and_zero_at_equal():
    g = torch.Generator().manual_seed(0)
    lp, lp_ref = -torch.rand(64, 32, generator=g) * 5, -torch.rand(64, 32, generator=g) * 5
    assert (kl_penalty(lp, lp_ref, "k3") >= 0).all()
    assert kl_penalty(lp, lp, "k3").abs().max() == 0
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'; allowed: k1, k2, k3"):
        kl_penalty(lp, lp_ref, "k4")


def test_kl_k2_value_and_gradient():
    # pi = 0.5 and 0.25 on the sampled tokens, pi_ref = 0.25 and 1: d = log(ref/pi) = -log 2, log 4
    lp = torch.tensor([LOG(0.5), LOG(0.25)], requires_grad=True)
    lp_ref = torch.tensor([LOG(0.25), LOG(1.0)])
    k2 = kl_penalty(lp, lp_ref, "k2")
    torch.testing.assert_close(k2.detach(), torch.tensor([0.5 * LOG(2) ** 2, 0.5 * LOG(4) ** 2]))
    k2.sum().backward()
    # d/dlp (d^2 / 2) = -d = lp - lp_ref: log 2 and -log 4, the score weights of grad KL(pi || ref)
    torch.testing.assert_close(lp.grad, torch.tensor([LOG(2), -LOG(4)]))


def _expected_kl_gradient(kind):
    """Exact E_{y ~ pi}[grad_theta k(y)] for pi = softmax(theta) over 3 tokens, by enumeration."""
    theta = torch.tensor([0.3, -0.2, 0.9], dtype=torch.float64, requires_grad=True)
    lp_ref = torch.log(torch.tensor([0.8, 0.15, 0.05], dtype=torch.float64))
    lp = torch.log_softmax(theta, dim=0)
    per_token = kl_penalty(lp, lp_ref, kind)  # the estimator at each possible sampled token
    expected = (lp.exp().detach() * per_token).sum()  # sampling weights held fixed: a loss's gradient
    (grad,) = torch.autograd.grad(expected, theta)
    return theta, lp_ref, grad


def test_kl_estimators_expected_gradients_tang_munos():
    """k1's expected gradient is 0, k2's that of KL(pi || ref), k3's that of KL(ref || pi) (arXiv 2506.09477)."""
    theta, lp_ref, g1 = _expected_kl_gradient("k1")
    torch.testing.assert_close(g1, torch.zeros(3, dtype=torch.float64))
    lp = torch.log_softmax(theta, dim=0)
    kl_reverse, kl_forward = (lp.exp() * (lp - lp_ref)).sum(), (lp_ref.exp() * (lp_ref - lp)).sum()
    (g_reverse,) = torch.autograd.grad(kl_reverse, theta, retain_graph=True)  # grad KL(pi || ref)
    (g_forward,) = torch.autograd.grad(kl_forward, theta)  # grad KL(ref || pi)
    torch.testing.assert_close(_expected_kl_gradient("k2")[2], g_reverse)
    torch.testing.assert_close(_expected_kl_gradient("k3")[2], g_forward)
    assert (g_reverse - g_forward).abs().max() > 0.1  # the two directions differ here


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_kl_off_the_mask_cannot_overflow(kind):
    """Prompt or padding positions where lp_ref - lp > 88 (exp overflows in fp32) give a finite loss and gradient."""
    lp, lp_old, adv, mask, seq_ids = _ratio_case()
    lp_ref = lp.detach().clone()
    lp_ref[:, 3] = lp.detach()[:, 3] + 200.0  # the masked column
    loss, stats = compute_loss(
        lp,
        lp_old,
        adv,
        mask,
        seq_ids,
        policy_loss="ppo",
        eps_low=0.2,
        eps_high=0.28,
        aggregation="token_mean",
        max_completion_tokens=4,
        lp_ref=lp_ref,
        beta=0.1,
        kl_kind=kind,
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(lp.grad).all()
    assert stats["kl_mean"] == 0.0 and stats["kl_loss"] == 0.0  # lp_ref equals lp on every sampled token
    assert (lp.grad[:, 3] == 0).all()


def _agg_case():
    loss = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 5.0, 9.0, 9.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    seq_ids = torch.tensor([[0, 0, 0, -1], [1, 1, -1, -1]])
    return loss, mask, seq_ids


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("token_mean", 15 / 5), ("sequence_mean", (6 / 3 + 9 / 2) / 2), ("constant", 15 / (2 * 4))],
)
def test_aggregation_normalizers(mode, expected):
    loss, mask, seq_ids = _agg_case()
    assert aggregate(loss, mask, seq_ids, mode, max_completion_tokens=4).item() == pytest.approx(expected)
    packed = aggregate(
        torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]]),
        torch.ones(1, 5, dtype=torch.bool),
        torch.tensor([[0, 0, 0, 1, 1]]),
        mode,
        max_completion_tokens=4,
    )
    assert packed.item() == pytest.approx(expected)
    # split into two micro batches with the step's counts, the parts add up to the whole
    parts = [
        aggregate(
            loss[i : i + 1],
            mask[i : i + 1],
            seq_ids[i : i + 1] - i * (seq_ids[i : i + 1] >= 0).long(),
            mode,
            max_completion_tokens=4,
            num_sequences=2,
            num_tokens=5,
        )
        for i in range(2)
    ]
    assert sum(p.item() for p in parts) == pytest.approx(expected)


def test_constant_aggregation_counts_every_rollout_of_the_step():
    """Dr. GRPO divides by all G x L of the step: rollouts of dropped groups count, though they add no loss."""
    loss, mask, seq_ids = _agg_case()
    # 2 sequences trained out of 6 rollouts (a group of 4 had zero variance): 15 / (6 x 4)
    common = dict(max_completion_tokens=4, num_sequences=2, num_tokens=5, num_rollouts=6)
    assert aggregate(loss, mask, seq_ids, "constant", **common).item() == pytest.approx(15 / 24)
    assert aggregate(loss, mask, seq_ids, "token_mean", **common).item() == pytest.approx(15 / 5)
    assert aggregate(loss, mask, seq_ids, "sequence_mean", **common).item() == pytest.approx(
        (6 / 3 + 9 / 2) / 2
    )


def test_aggregation_unknown_mode():
    loss, mask, seq_ids = _agg_case()
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'"):
        aggregate(loss, mask, seq_ids, "sum", max_completion_tokens=4)


def test_compute_loss_on_policy_is_plain_policy_gradient():
    lp, _, adv, mask, seq_ids = _ratio_case()
    lp_old = lp.detach().clone()
    loss, stats = compute_loss(
        lp,
        lp_old,
        adv,
        mask,
        seq_ids,
        policy_loss="ppo",
        eps_low=0.2,
        eps_high=0.28,
        aggregation="token_mean",
        max_completion_tokens=4,
    )
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.where(mask, -adv / 6, torch.zeros(())))
    assert loss.item() == pytest.approx(0.0)  # (3 * -1 + 3 * +1) / 6
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["clip_fraction"] == 0.0
    assert stats["mismatch_k1_mean"] == pytest.approx(0.0) and stats["mismatch_abs_max"] == 0.0
    assert "kl_mean" not in stats


def test_compute_loss_with_kl_and_mismatch_stats():
    lp, lp_old, adv, mask, seq_ids = _ratio_case()
    lp_ref = lp.detach() - LOG(2)  # d = -log 2 on every token: k3 = 0.5 + log 2 - 1
    loss, stats = compute_loss(
        lp,
        lp_old,
        adv,
        mask,
        seq_ids,
        policy_loss="ppo",
        eps_low=0.2,
        eps_high=0.28,
        aggregation="token_mean",
        max_completion_tokens=4,
        lp_ref=lp_ref,
        beta=0.1,
        kl_kind="k3",
    )
    policy = (-1.28 - 0.5 - 1.1 + 1.5 + 0.8 + 1.1) / 6
    k3 = 0.5 + LOG(2) - 1
    assert loss.item() == pytest.approx(policy + 0.1 * k3, abs=1e-6)
    assert stats["policy_loss"] == pytest.approx(policy, abs=1e-6)
    assert stats["kl_mean"] == pytest.approx(k3, abs=1e-6)
    assert stats["clip_fraction"] == pytest.approx(2 / 6)
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1) / 3, abs=1e-6)
    # k1 of KL(sampler || trainer) = mean(lp_old - lp) = -mean(log rho)
    assert stats["mismatch_k1_mean"] == pytest.approx(-(LOG(1.5) + LOG(0.5) + LOG(1.1)) / 3, abs=1e-6)
    k3_mismatch = sum(r - 1 - LOG(r) for r in (1.5, 0.5, 1.1)) / 3
    assert stats["mismatch_k3_mean"] == pytest.approx(k3_mismatch, abs=1e-6)
    assert stats["mismatch_abs_max"] == pytest.approx(LOG(2), abs=1e-6)


def test_the_mismatch_of_a_float32_sampler_is_measured_not_rounded_away():
    # a float32 sampler and trainer differ by ~1e-5 per token: k3 = exp(d) - d - 1 ~ d^2 / 2 ~ 5e-11,
    # below float32's resolution at 1, so a float32 exp(d) - d - 1 gives 0.0 or a negative "KL"
    lp = torch.tensor([[-2.2222452, -0.6232163, -1.9512461, -7.2618456]], requires_grad=True)
    d = torch.tensor([[1.5e-5, -2.5e-5, 4.0e-5, -1.0e-5]])
    lp_old = lp.detach() - d
    mask = torch.ones_like(lp, dtype=torch.bool)
    _, stats = compute_loss(
        lp,
        lp_old,
        torch.ones_like(lp),
        mask,
        torch.zeros_like(mask, dtype=torch.long),
        policy_loss="ppo",
        eps_low=0.2,
        eps_high=0.28,
        aggregation="token_mean",
        max_completion_tokens=4,
    )
    actual = (lp.detach().double() - lp_old.double())[0]  # the float32 differences, exactly
    k3 = float(sum(math.expm1(x) - x for x in actual.tolist()) / 4)  # ~ 3.0e-10
    assert stats["mismatch_k3_mean"] == pytest.approx(k3, rel=1e-6) and 3.0e-10 < k3 < 3.3e-10
    assert stats["mismatch_k1_mean"] == pytest.approx(float(-actual.mean()), rel=1e-6)
    assert stats["mismatch_abs_max"] == pytest.approx(float(actual.abs().max()), rel=1e-6)


def test_compute_loss_errors():
    lp, lp_old, adv, mask, seq_ids = _ratio_case()
    common = dict(eps_low=0.2, eps_high=0.28, aggregation="token_mean", max_completion_tokens=4)
    with pytest.raises(ValueError, match="unknown policy loss 'reinforce'; allowed: cispo, gspo, ppo"):
        compute_loss(lp, lp_old, adv, mask, seq_ids, policy_loss="reinforce", **common)
    with pytest.raises(ValueError, match="needs reference logprobs"):
        compute_loss(lp, lp_old, adv, mask, seq_ids, policy_loss="ppo", beta=0.1, **common)


def test_the_loss_built_from_the_algorithm_section_is_compute_loss_with_its_settings():
    lp, lp_old, adv, mask, seq_ids = _ratio_case()
    lp_ref = lp.detach() - LOG(2)  # d = -log 2 on every token: k3 = 0.5 + log 2 - 1
    algorithm = AlgorithmConfig(
        loss="ppo", eps_low=0.2, eps_high=0.28, aggregation="token_mean", kl_beta=0.1, kl_kind="k3"
    )
    loss_fn = build_loss(algorithm, max_completion_tokens=4)
    assert (
        loss_fn.needs_reference and not build_loss(AlgorithmConfig(), max_completion_tokens=4).needs_reference
    )
    loss, stats = loss_fn(lp, lp_old, adv, mask, seq_ids, lp_ref=lp_ref)
    policy = (-1.28 - 0.5 - 1.1 + 1.5 + 0.8 + 1.1) / 6
    assert loss.item() == pytest.approx(policy + 0.1 * (0.5 + LOG(2) - 1), abs=1e-6)
    assert stats["policy_loss"] == pytest.approx(policy, abs=1e-6)


def test_the_built_loss_divides_by_the_step_and_every_rollout_it_asked_for():
    """Dr. GRPO's constant: the step's 6 rollouts x 4 tokens, whatever this micro-batch holds."""
    lp, _, adv, mask, seq_ids = _ratio_case()
    on_policy = lp.detach().clone()  # ratio 1: the loss is -sum(A) over sampled tokens / the constant
    constant = build_loss(
        AlgorithmConfig(aggregation="constant"), max_completion_tokens=4, rollouts_per_step=6
    )
    loss, _ = constant(lp, on_policy, adv, mask, seq_ids, counts=StepCounts(num_sequences=2, num_tokens=6))
    assert loss.item() == pytest.approx((-3 + 3) / 24)
    token_mean = build_loss(AlgorithmConfig(), max_completion_tokens=4)
    first_row, _ = token_mean(lp[:1], on_policy[:1], adv[:1], mask[:1], seq_ids[:1], counts=StepCounts(2, 6))
    assert first_row.item() == pytest.approx(-3 / 6)  # one micro-batch's share of the step's token mean


def test_a_loss_with_an_unknown_setting_is_refused_when_built():
    with pytest.raises(ValueError, match="unknown policy loss 'reinforce'; allowed: cispo, gspo, ppo"):
        Loss(
            policy_loss="reinforce",
            eps_low=0.2,
            eps_high=0.28,
            aggregation="token_mean",
            max_completion_tokens=4,
        )
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'"):
        Loss(policy_loss="ppo", eps_low=0.2, eps_high=0.28, aggregation="sum", max_completion_tokens=4)


def test_the_tis_weight_is_the_truncated_ratio_of_trainer_to_sampler():
    lp_train = torch.tensor([[-1.0, -1.0, -0.5, 7.0], [-2.0, -0.1, -3.0, 0.0]])
    lp_sampler = torch.tensor([[-1.0, -2.0, -0.4, -9.0], [-2.5, -0.1, -1.0, 0.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, False]])
    w = tis_weight(lp_train, lp_sampler, mask, cap=2.0)
    # min(exp(lp_train - lp_sampler), 2) on the mask: e^0, e^1 -> 2, e^-0.1, e^0.5, e^0, e^-2; 0 off it
    expected = [[1.0, 2.0, math.exp(-0.1), 0.0], [math.exp(0.5), 1.0, math.exp(-2.0), 0.0]]
    torch.testing.assert_close(w, torch.tensor(expected))
    assert tis_weight(lp_train, lp_sampler, mask, cap=10.0)[0, 1].item() == pytest.approx(math.e)
    # sampler and trainer agree: every weight is 1, whatever the cap
    for cap in (1.0, 2.0, 100.0):
        assert tis_weight(lp_train, lp_train.clone(), mask, cap)[mask].tolist() == [1.0] * 6


def _tis_loss(lp, lp_sampler, adv, mask, seq_ids, **kw):
    return compute_loss(
        lp,
        lp_sampler,
        adv,
        mask,
        seq_ids,
        policy_loss="ppo",
        eps_low=0.2,
        eps_high=0.28,
        aggregation="token_mean",
        max_completion_tokens=4,
        **kw,
    )


def test_tis_weights_each_tokens_policy_gradient_and_is_a_no_op_when_sampler_and_trainer_agree():
    lp, lp_sampler, adv, mask, seq_ids = _ratio_case()  # trainer / sampler ratios 1.5, 0.5, 1.1
    loss, stats = _tis_loss(lp, lp_sampler, adv, mask, seq_ids, tis_cap=1.2)
    loss.backward()
    # the PPO ratio against sg(lp) is 1: gradient -w_t A_t / 6 with w = min(ratio, 1.2) = 1.2, 0.5, 1.1
    w = torch.tensor([1.2, 0.5, 1.1, 0.0])
    torch.testing.assert_close(lp.grad, torch.stack([-w / 6, w / 6]))
    assert loss.item() == pytest.approx(0.0, abs=1e-7)  # (-A w + A w) over the two rows
    assert stats["tis_weight_mean"] == pytest.approx((1.2 + 0.5 + 1.1) / 3)
    assert stats["tis_capped_fraction"] == pytest.approx(1 / 3)
    assert stats["clip_fraction"] == 0.0  # nothing is clipped against the trainer's own logprobs
    assert stats["mismatch_k1_mean"] == pytest.approx(-(LOG(1.5) + LOG(0.5) + LOG(1.1)) / 3)

    # sampler == trainer: the same loss and gradient as without the correction
    grads = []
    for cap in (None, 2.0):
        lp2 = lp.detach().clone().requires_grad_(True)
        out, _ = _tis_loss(lp2, lp.detach().clone(), adv, mask, seq_ids, tis_cap=cap)
        out.backward()
        grads.append((out.item(), lp2.grad))
    assert grads[0][0] == pytest.approx(grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


def test_the_loss_built_with_tis_cap_applies_it_and_a_cap_below_one_is_refused():
    lp, lp_sampler, adv, mask, seq_ids = _ratio_case()
    loss = build_loss(AlgorithmConfig(tis_cap=1.2), max_completion_tokens=4)
    assert loss.tis_cap == 1.2
    _, stats = loss(lp, lp_sampler, adv, mask, seq_ids)
    assert stats["tis_weight_mean"] == pytest.approx((1.2 + 0.5 + 1.1) / 3)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        AlgorithmConfig(tis_cap=0.5)
    with pytest.raises(ValueError, match="tis_cap=0.5"):
        _tis_loss(lp, lp_sampler, adv, mask, seq_ids, tis_cap=0.5)


def test_stale_tokens_under_tis_take_the_trainers_old_logprobs_for_the_weight_and_the_clipped_ratio():
    """Yao et al.: w = min(pi_old_tr / pi_sampler, C) with pi_old_tr the trainer's policy at the
    version that sampled the token, and rho = pi / pi_old_tr clipped as PPO's."""
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    sampler = torch.tensor([[-1.2, -1.5, -0.5]])
    train_old = torch.tensor([[-1.5, -2.0, -0.4]])  # the trainer's, under the sampling version
    adv, mask, seq_ids = (
        torch.tensor([[1.0, 1.0, -1.0]]),
        torch.ones(1, 3, dtype=torch.bool),
        torch.zeros(1, 3),
    )
    loss, stats = compute_loss(
        lp,
        sampler,
        adv,
        mask,
        seq_ids.long(),
        policy_loss="ppo",
        eps_low=0.2,
        eps_high=0.2,
        aggregation="token_mean",
        max_completion_tokens=3,
        tis_cap=2.0,
        lp_train_old=train_old,
    )
    loss.backward()
    w = [math.exp(-0.3), math.exp(-0.5), math.exp(0.1)]  # min(exp(train_old - sampler), 2)
    # rho = e^0.5 (A > 0: clipped at 1.2, no gradient), e^0 = 1, e^-0.1 (inside the clip range)
    per_token = [-w[0] * 1.2, -w[1] * 1.0, w[2] * math.exp(-0.1)]
    assert loss.item() == pytest.approx(sum(per_token) / 3, rel=1e-6)
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, -w[1] / 3, w[2] * math.exp(-0.1) / 3]]))
    assert stats["clip_fraction"] == pytest.approx(1 / 3)
    assert stats["tis_weight_mean"] == pytest.approx(sum(w) / 3, rel=1e-6)
    with pytest.raises(ValueError, match="lp_train_old is the old policy of truncated importance sampling"):
        compute_loss(
            lp,
            sampler,
            adv,
            mask,
            seq_ids.long(),
            policy_loss="ppo",
            eps_low=0.2,
            eps_high=0.2,
            aggregation="token_mean",
            max_completion_tokens=3,
            lp_train_old=train_old,
        )


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"policy_loss": "reinforce"}, "unknown policy loss 'reinforce'; allowed: cispo, gspo, ppo"),
        (
            {"aggregation": "sum"},
            "unknown loss aggregation 'sum'; allowed: token_mean, sequence_mean, constant",
        ),
        ({"kl_kind": "k4"}, "unknown KL estimator 'k4'; allowed: k1, k2, k3"),
        ({"tis_cap": 0.5}, "tis_cap=0.5: the truncation C must be >= 1 (a weight of 1 is no correction)"),
    ],
)
def test_a_bad_loss_setting_is_refused_when_the_loss_is_built_with_the_same_line_compute_loss_gives(
    setting, message
):
    """The settings are checked in one place, `Loss`, when it is built: `compute_loss` builds one from
    its keywords, so both refuse a bad setting with the same one line, even a setting this batch
    would not have used (the KL estimator with beta = 0)."""
    settings = dict(
        policy_loss="ppo", eps_low=0.2, eps_high=0.28, aggregation="token_mean", max_completion_tokens=4
    )
    settings.update(setting)
    with pytest.raises(ValueError) as built:
        Loss(**settings)
    lp, lp_old, adv, mask, seq_ids = _ratio_case()
    with pytest.raises(ValueError) as computed:
        compute_loss(lp, lp_old, adv, mask, seq_ids, **settings)
    assert str(built.value) == str(computed.value) == message


# ---- a rollout whose template broke the prefix: one sequence of the loss, in two token sequences ----
def _rollouts_with_a_break():
    """Four rollouts of one group; rollout 0's second turn does not extend its first (a template that
    rewrites history), so it is two token sequences. Every sampled token's current logprob is -1 and
    its sampling logprob -1 - log rho_t, so rho_t is set per token whatever the batch layout.

    rollout 0 (A = +1): turn 1 one token with rho = e^0.4; turn 2 three tokens with rho = 1;
    rollout 1 (A = -1): two tokens, rho = 1; rollout 2 (A = +0.5): one token, rho = 1;
    rollout 3 (A = +0.25): three tokens, rho = e^0.3 each.
    """
    from grooves.core.trajectory import SampledTurn, Trajectory

    def turn(prompt, log_rhos):
        ids = [100 + i for i in range(len(log_rhos))]
        return SampledTurn(prompt_token_ids=prompt, token_ids=ids, logprobs=[-1.0 - r for r in log_rhos])

    split = Trajectory(turns=[turn([1, 2], [0.4]), turn([1, 3], [0.0, 0.0, 0.0])])
    whole = [Trajectory(turns=[turn([1, 4], [0.0, 0.0])]), Trajectory(turns=[turn([1, 5], [0.0])])]
    whole.append(Trajectory(turns=[turn([1, 6], [0.3, 0.3, 0.3])]))
    return [split, *whole], [1.0, -1.0, 0.5, 0.25]


def _batch_of_rollouts():
    from grooves.core.tokenize import pad_batch, trajectory_to_sequences
    from grooves.training.step import step_counts

    trajs, advantages = _rollouts_with_a_break()
    seqs = [s for t, a in zip(trajs, advantages, strict=True) for s in trajectory_to_sequences(t, a)]
    assert len(seqs) == 5  # rollout 0 is two token sequences
    batch = pad_batch(seqs)
    lp = torch.where(batch.sampled_mask, -1.0, 0.0).requires_grad_(True)  # [5, T]
    return batch, lp, step_counts(seqs)


def test_sequence_mean_weighs_a_rollout_split_at_a_prefix_break_as_one_rollout():
    """GRPO's mean over sequences is a mean over rollouts: each of the 4 has a 1/4 share, the split one
    included (as 2 of 5 separate sequences it had 2/5)."""
    batch, on_policy, counts = _batch_of_rollouts()
    assert counts == StepCounts(num_sequences=4, num_tokens=10)
    lp = batch.old_logprobs.clone().requires_grad_(True)  # rho = 1 everywhere: l_t = -A
    loss_fn = Loss("ppo", 0.2, 0.2, "sequence_mean", max_completion_tokens=4)
    loss, _ = loss_fn(
        lp, batch.old_logprobs, batch.advantages, batch.sampled_mask, batch.rollout_ids, counts=counts
    )
    assert float(loss.detach()) == pytest.approx(-(1.0 - 1.0 + 0.5 + 0.25) / 4, abs=1e-6)
    loss.backward()
    # d loss / d lp_t = -A / (n_rollout x 4): a rollout's share is the sum over its tokens of grad / -A
    grad = lp.grad
    assert grad is not None
    shares = [
        float(grad[rows].sum()) / -a for rows, a in (([0, 1], 1.0), ([2], -1.0), ([3], 0.5), ([4], 0.25))
    ]
    assert shares == pytest.approx([0.25, 0.25, 0.25, 0.25], abs=1e-6)
    assert float(grad[0, batch.sampled_mask[0]][0]) == pytest.approx(-1.0 / (4 * 4), abs=1e-7)


def test_gspo_takes_one_ratio_per_rollout_across_its_token_sequences():
    """Rollout 0's ratio is the geometric mean over its four tokens, e^((0.4 + 0 + 0 + 0) / 4) = e^0.1,
    inside the clip range [0.8, 1.2]: none of its tokens is clipped and all keep a gradient (its first
    turn alone, e^0.4 = 1.49, would be clipped). Rollout 3's e^0.3 = 1.35 is clipped, A > 0."""
    batch, lp, counts = _batch_of_rollouts()
    loss_fn = Loss("gspo", 0.2, 0.2, "sequence_mean", max_completion_tokens=4)
    loss, stats = loss_fn(
        lp, batch.old_logprobs, batch.advantages, batch.sampled_mask, batch.rollout_ids, counts=counts
    )
    s0 = math.exp(0.1)
    # mean over rollouts of -min(s A, clip(s) A): -s0, +1, -0.5, -1.2 x 0.25
    assert float(loss.detach()) == pytest.approx((-s0 + 1.0 - 0.5 - 0.3) / 4, abs=1e-6)
    assert stats["clip_fraction"] == pytest.approx(3 / 10, abs=1e-6)  # rollout 3's tokens only
    loss.backward()
    grad = lp.grad
    assert grad is not None
    mask = batch.sampled_mask
    # d/d lp_t of -s0 A / 4 with s0 = exp(mean of 4 log ratios): -A s0 / (4 x 4) on each of its tokens
    rollout0 = torch.cat([grad[0][mask[0]], grad[1][mask[1]]])
    assert rollout0.tolist() == pytest.approx([-s0 / 16] * 4, abs=1e-6)
    assert grad[4][mask[4]].tolist() == pytest.approx([0.0] * 3, abs=1e-9)  # clipped: no gradient
