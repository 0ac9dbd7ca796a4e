"""The `[algorithm]` section: advantages, the policy loss, its aggregation and the KL penalty.

docs/training.md gives each choice's formula and paper; `grooves.core.loss.build_loss` turns
this section into the loss a run calls on every micro-batch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from grooves.config.base import Section


class AlgorithmConfig(Section):
    advantage: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    """grpo: (r - mean)/std; dr_grpo: r - mean (no std, no length bias); rloo: leave-one-out baseline."""
    scale_by_std: bool = True
    """GRPO only. Dividing by std up-weights near-unanimous groups (a known difficulty bias)."""
    std_floor: float = Field(1e-3, gt=0)
    """Floor on the group std, so fractional rewards with float-residue variance can't explode."""
    loss: Literal["ppo", "cispo", "gspo"] = "ppo"
    """ppo: token ratio clipping (DAPO with eps_high > eps_low); cispo: clipped IS weight, every token
    keeps its gradient; gspo: one sequence-level ratio (geometric mean of token ratios)."""
    eps_low: float = Field(0.2, gt=0, lt=1)
    """PPO clip below: a token's ratio under 1 - eps_low stops adding gradient when its advantage is negative."""
    eps_high: float = Field(0.28, gt=0)
    """Clip range [1 - eps_low, 1 + eps_high]. DAPO's clip-higher (0.28 > 0.2) keeps exploration.
    For gspo use ~3e-4 / 4e-4."""
    aggregation: Literal["token_mean", "sequence_mean", "constant"] = "token_mean"
    """token_mean (DAPO): every token weighs the same, divided by the tokens trained this step.
    sequence_mean (GRPO): per-sequence means, biased toward long wrong answers (see Dr. GRPO).
    constant (Dr. GRPO): sum / (groups_per_step x group_size x rollout.max_tokens), one number for
    the whole run: rollouts of dropped zero-variance groups (and failed ones) count, as in the
    paper. max_tokens is a per-turn budget: a multi-turn rollout may hold more sampled tokens than
    it, and each of them weighs the same 1 / constant as a one-turn rollout's."""
    kl_beta: float = Field(0.0, ge=0)
    """Weight of the per-token KL penalty to the reference policy (`kl_reference`), added to the
    loss and aggregated like it. 0, the default, is no penalty (as in DAPO) and skips the reference
    forward; `kl_kind` says which divergence a positive weight penalizes."""
    kl_reference: Literal["start", "base"] = "start"
    """What the KL penalty pulls toward. start: the policy the RL began from, i.e. the adapter of
    `model.init_adapter` or of the `[sft]` stage, loaded a second time and kept frozen (the SFT
    model as the reference, as in InstructGPT, Ouyang et al. 2022, arXiv 2203.02155), or the base
    model when the run starts from a fresh adapter; base: the base model with no adapter, which
    after a warm start pulls away from what SFT taught (tool calls the base never makes)."""
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    """Which per-token estimator, d = lp_ref - lp, is differentiated as the penalty. The choice sets
    which KL the gradient pulls down (Tang & Munos 2025, arXiv 2506.09477; all on-policy, per token):
    k3 = exp(d) - d - 1 (GRPO's, the default): expected gradient that of KL(ref || pi), the
    mass-covering direction, not KL(pi || ref); still a divergence to the reference, zero only at it.
    k2 = d^2 / 2: expected gradient exactly that of KL(pi || ref), the penalty as usually written.
    k1 = -d: zero expected gradient, the penalty does nothing but add noise; for comparison only.
    `kl_mean` in the metrics is the k3 estimate of KL(pi || ref) whichever is chosen."""
    tis_cap: float | None = Field(None, ge=1)
    """Truncated importance sampling for a sampler that is not the trainer's function
    (`model.sampler_precision` int8 or bfloat16): each token's loss is weighted by
    min(pi_train_old / pi_sampler, tis_cap), and the PPO ratio is taken against the trainer's own
    logprobs under the adapter version that sampled each turn (Yao et al. 2025, the FlashRL report;
    C = 2 there); with `rollout.max_staleness` k > 0 the trainer keeps its last k + 1 versions for it.
    Unset: no weight, the sampler's logprobs are the old policy's, right when the sampler is the
    trainer's function (float32, mismatch ~1e-6). Larger C: less bias, more variance. Must be >= 1."""
