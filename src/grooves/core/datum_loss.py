"""Per-token losses summed over tokens: the built-in losses of the Tinker API, on grooves' own terms.

The Tinker API trains on "datums": one token sequence, and per position t a target token, its
learner logprob `lp_t` (computed here) and the loss's inputs, all `[N]`. Its losses are sums over
the tokens, with no normalization by length or batch (a caller who wants a mean scales the
advantages or weights). Each is grooves' own per-token loss from `core.loss`, summed:

- `cross_entropy`: sum_t -w_t lp_t, with per-token `weights` w (0 on the prompt, 1 on the
  completion for supervised fine-tuning).
- `importance_sampling`: sum_t -rho_t A_t with rho_t = exp(lp_t - lp_old_t), the REINFORCE
  gradient corrected for a sampler that is not the learner: `core.loss.ppo_clip` with a clip
  range that clips nothing (eps_low = 1, eps_high = inf), whose per-token loss is -rho_t A_t.
- `ppo`: `core.loss.ppo_clip`, l_t = -min(rho_t A_t, clip(rho_t, low, high) A_t) (Schulman et al.
  2017), with the thresholds `clip_low_threshold` (0.8) and `clip_high_threshold` (1.2).
- `cispo`: `core.loss.cispo`, l_t = -sg(clip(rho_t, low, high)) A_t lp_t (MiniMax 2025, arXiv
  2506.13585), with the same thresholds.

`lp_old` is the sampler's logprob of each target (the datum's `logprobs`), `A` its `advantages`.
A position whose advantage (or weight) is 0 adds nothing to the loss or its gradient, which is
how a prompt position is left out.

>>> lp = torch.tensor([-1.0, -0.5])
>>> inputs = {"logprobs": torch.tensor([-1.0, -1.0]), "advantages": torch.tensor([2.0, 1.0])}
>>> round(float(datum_loss("importance_sampling", lp, inputs, {})), 4)  # -(1 * 2 + e^0.5 * 1)
-3.6487
>>> round(float(datum_loss("ppo", lp, inputs, {})), 4)  # the second ratio clipped at 1.2
-3.2
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from grooves.core.loss import cispo, ppo_clip

REQUIRED_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
}
"""The `loss_fn_inputs` each loss reads (each a `[N]` tensor, N the datum's length)."""

CONFIG_KEYS: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
}
"""The `loss_fn_config` keys each loss honours, with their defaults; any other key is refused."""


class DatumLossError(ValueError):
    """A loss name, config key or value that these losses do not take."""


def loss_config(loss_fn: str, config: Mapping[str, object]) -> dict[str, float]:
    """The loss's settings: its defaults with `config` applied, each checked (`DatumLossError`)."""
    if loss_fn not in CONFIG_KEYS:
        raise DatumLossError(
            f"loss_fn {loss_fn!r} is not supported here; supported: {', '.join(CONFIG_KEYS)}"
        )
    out = dict(CONFIG_KEYS[loss_fn])
    for key, value in config.items():
        if key not in out:
            allowed = ", ".join(out) or "none"
            raise DatumLossError(f"loss_fn_config.{key}: not an option of {loss_fn!r} (it takes: {allowed})")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise DatumLossError(f"loss_fn_config.{key}: {value!r} is not a finite number")
        out[key] = float(value)
    if "clip_low_threshold" in out:
        low, high = out["clip_low_threshold"], out["clip_high_threshold"]
        if not 0.0 <= low <= 1.0 <= high:
            raise DatumLossError(
                f"loss_fn_config: clip_low_threshold {low} and clip_high_threshold {high} must satisfy "
                "0 <= low <= 1 <= high (the ratio's clip range around 1)"
            )
    return out


def datum_loss(
    loss_fn: str, lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, object]
) -> torch.Tensor:
    """The loss of one datum, a scalar: `loss_fn` on its learner logprobs `lp` [N] (with grad) and
    its `inputs` (each [N]), summed over the N positions."""
    settings = loss_config(loss_fn, config)
    return _LOSSES[loss_fn](lp, inputs, settings)


def _cross_entropy(lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], _: dict[str, float]) -> torch.Tensor:
    return -(inputs["weights"] * lp).sum()


def _policy(policy_loss, eps: Callable[[dict[str, float]], tuple[float, float]]):
    """A policy loss of `core.loss` on one datum: every position is a sampled token, one sequence."""

    def loss(
        lp: torch.Tensor, inputs: Mapping[str, torch.Tensor], settings: dict[str, float]
    ) -> torch.Tensor:
        eps_low, eps_high = eps(settings)
        row = (lp[None], inputs["logprobs"][None], inputs["advantages"][None])  # [1, N] each
        mask = torch.ones_like(row[0], dtype=torch.bool)  # [1, N]
        seq_ids = torch.zeros_like(row[0], dtype=torch.long)  # [1, N]
        out = policy_loss(*row, mask, seq_ids, eps_low=eps_low, eps_high=eps_high)
        return out.loss.sum()

    return loss


def _thresholds(settings: dict[str, float]) -> tuple[float, float]:
    return 1.0 - settings["clip_low_threshold"], settings["clip_high_threshold"] - 1.0


_LOSSES = {
    "cross_entropy": _cross_entropy,
    "importance_sampling": _policy(ppo_clip, lambda _: (1.0, math.inf)),
    "ppo": _policy(ppo_clip, _thresholds),
    "cispo": _policy(cispo, _thresholds),
}
