"""The Tinker losses (`core.datum_loss`) against hand-computed numbers: token sums, no means."""

from __future__ import annotations

import math

import pytest
import torch

from grooves.core.datum_loss import DatumLossError, datum_loss, loss_config

LP = [-1.0, -0.5, -2.0]
OLD = [-1.0, -1.0, -1.0]
ADV = [2.0, 1.0, -1.0]
# ratios exp(lp - old): 1, e^0.5 = 1.648721, e^-1 = 0.367879


def _run(loss_fn: str, config=None, weights=None):
    lp = torch.tensor(LP, requires_grad=True)
    inputs = {"logprobs": torch.tensor(OLD), "advantages": torch.tensor(ADV)}
    if weights is not None:
        inputs = {"weights": torch.tensor(weights)}
    loss = datum_loss(loss_fn, lp, inputs, config or {})
    loss.backward()
    return float(loss.detach()), lp.grad.tolist()


def test_cross_entropy_is_the_weighted_sum_of_negative_logprobs():
    loss, grad = _run("cross_entropy", weights=[0.0, 1.0, 2.0])
    assert loss == pytest.approx(0.5 + 4.0)  # -(0 * -1 + 1 * -0.5 + 2 * -2)
    assert grad == pytest.approx([0.0, -1.0, -2.0])


def test_importance_sampling_is_a_token_sum_of_ratio_times_advantage():
    loss, grad = _run("importance_sampling")
    e = math.exp(0.5)
    assert loss == pytest.approx(-(1 * 2 + e * 1 + math.exp(-1) * -1), rel=1e-6)  # -2.0 - 1.648721 + 0.367879
    assert grad == pytest.approx([-2.0, -e, math.exp(-1)], rel=1e-6)  # d(-rho A)/d lp = -rho A


def test_ppo_clips_the_ratio_at_its_thresholds():
    loss, grad = _run("ppo")  # 0.8 .. 1.2
    # token 2: min(1.6487 * 1, 1.2 * 1) = 1.2, clipped (no gradient); token 3: A < 0, min(-0.3679, -0.8) = -0.8, clipped
    assert loss == pytest.approx(-(2.0 + 1.2 - 0.8), rel=1e-6)
    assert grad == pytest.approx([-2.0, 0.0, 0.0])
    loss, grad = _run("ppo", {"clip_low_threshold": 0.3, "clip_high_threshold": 2.0})  # nothing clipped
    assert loss == pytest.approx(-(2.0 + math.exp(0.5) - math.exp(-1)), rel=1e-6)


def test_cispo_keeps_every_tokens_gradient_with_a_clipped_weight():
    loss, grad = _run("cispo")
    # l_t = -sg(clip(rho, 0.8, 1.2)) A lp: weights 1, 1.2, 0.8
    assert loss == pytest.approx(-(1 * 2 * -1.0 + 1.2 * 1 * -0.5 + 0.8 * -1 * -2.0), rel=1e-6)
    assert grad == pytest.approx([-2.0, -1.2, 0.8], rel=1e-6)


def test_options_a_loss_does_not_take_are_refused_by_name():
    with pytest.raises(
        DatumLossError, match=r"loss_fn_config.beta: not an option of 'ppo' \(it takes: clip_low_threshold"
    ):
        loss_config("ppo", {"beta": 0.1})
    with pytest.raises(DatumLossError, match="it takes: none"):
        loss_config("importance_sampling", {"clip_low_threshold": 0.5})
    with pytest.raises(DatumLossError, match="must satisfy 0 <= low <= 1 <= high"):
        loss_config("cispo", {"clip_low_threshold": 1.5})
    with pytest.raises(DatumLossError, match="loss_fn 'dro' is not supported here"):
        loss_config("dro", {})
    with pytest.raises(DatumLossError, match="is not a finite number"):
        loss_config("ppo", {"clip_high_threshold": float("inf")})
