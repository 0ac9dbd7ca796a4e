"""Policy-gradient losses as pure functions on token tensors: PPO/DAPO clip, CISPO, GSPO, KL, aggregation.

Every tensor is `[B, T]` and lines up with a `TrainBatch` (see `grooves.core.tokenize`): `lp` is the
current policy's logprob of token t (with grad), `lp_old` the sampler's, `adv` the advantage of
the sequence token t belongs to (per token, because a packed row holds several sequences), `mask`
is True exactly on sampled tokens, and `seq_ids` says which sequence of the batch each token is
in (-1 for padding). Values off the mask are ignored, whatever they hold. A sequence of the loss
is a rollout: where a template broke a trajectory's prefix, its token sequences are one sequence
here (the trainer passes `TrainBatch.rollout_ids`), so sequence_mean weighs every rollout alike
and GSPO takes one ratio per rollout, as the papers do, however many pieces it was trained in.

A policy loss returns the per-token loss (zero off the mask) and which tokens were clipped; how
token losses become one number is a separate choice (`aggregate`), because the papers differ in
exactly that. `POLICY_LOSSES` names the variants for the config; they share one signature.
`compute_loss` is the one place that puts policy loss, KL penalty and aggregation together and
measures the sampler/trainer logprob mismatch. A run configures it once: `build_loss` turns the
`[algorithm]` section into a `Loss`, which the trainer calls on each micro-batch's tensors and the
step's token and sequence counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol, get_args

import torch

if TYPE_CHECKING:
    from grooves.config import AlgorithmConfig

AggregationMode = Literal["token_mean", "sequence_mean", "constant"]
KLKind = Literal["k1", "k2", "k3"]


class PolicyLossOutput(NamedTuple):
    loss: torch.Tensor
    """[B, T] per-token loss to minimize, 0 off the mask."""
    clipped: torch.Tensor
    """[B, T] bool: the token's ratio was clipped (for PPO/GSPO: its gradient is zero)."""


class PolicyLoss(Protocol):
    def __call__(
        self,
        lp: torch.Tensor,
        lp_old: torch.Tensor,
        adv: torch.Tensor,
        mask: torch.Tensor,
        seq_ids: torch.Tensor,
        *,
        eps_low: float,
        eps_high: float,
    ) -> PolicyLossOutput: ...


def log_ratio(lp: torch.Tensor, lp_old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log rho_t = lp_t - lp_old_t on sampled tokens, 0 elsewhere (so exp never overflows on padding)."""
    return torch.where(mask, lp - lp_old, torch.zeros_like(lp))  # [B, T]


def ppo_clip(
    lp: torch.Tensor,
    lp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    seq_ids: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
) -> PolicyLossOutput:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv 1707.06347), per token.

    l_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t), rho_t = exp(lp_t - lp_old_t).
    Where the clipped term is the smaller one (A > 0 and rho > 1 + eps_high, or A < 0 and
    rho < 1 - eps_low) the token's gradient is zero. DAPO (Yu et al. 2025, arXiv 2503.14476)
    is this with clip-higher, eps_low = 0.2 and eps_high = 0.28. `seq_ids` is unused.
    """
    ratio = torch.exp(log_ratio(lp, lp_old, mask))  # [B, T]
    unclipped = ratio * adv  # [B, T]
    clipped_term = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv  # [B, T]
    loss = -torch.minimum(unclipped, clipped_term)  # [B, T]
    clipped = mask & (clipped_term < unclipped)  # [B, T]
    return PolicyLossOutput(torch.where(mask, loss, torch.zeros_like(loss)), clipped)


def cispo(
    lp: torch.Tensor,
    lp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    seq_ids: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
) -> PolicyLossOutput:
    """CISPO (MiniMax 2025, MiniMax-M1, arXiv 2506.13585): clip the importance weight, not the update.

    l_t = -sg(clip(rho_t, 1 - eps_low, 1 + eps_high)) * A_t * lp_t. The weight carries no
    gradient, so every sampled token keeps the gradient -w_t A_t d(lp_t), clipped or not (PPO
    would drop the clipped ones, often the rare tokens that matter for reasoning). `clipped`
    marks tokens whose weight was clamped. `seq_ids` is unused.
    """
    ratio = torch.exp(log_ratio(lp, lp_old, mask)).detach()  # [B, T]
    weight = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)  # [B, T], no grad
    loss = -weight * adv * lp  # [B, T]
    clipped = mask & ((ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high))  # [B, T]
    return PolicyLossOutput(torch.where(mask, loss, torch.zeros_like(loss)), clipped)


def gspo(
    lp: torch.Tensor,
    lp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    seq_ids: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
) -> PolicyLossOutput:
    """GSPO (Zheng et al. 2025, Group Sequence Policy Optimization, arXiv 2507.18071).

    One ratio per sequence, the geometric mean of its token ratios:
    s_i = exp(mean_{t in y_i} (lp_t - lp_old_t)), and
    l_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), with small eps (the paper
    uses 3e-4 / 4e-4). l_i is written to each of the sequence's sampled tokens, so with
    "sequence_mean" aggregation the result is exactly the paper's mean over sequences.
    Sequences are found through `seq_ids`, so packed rows work like padded ones; the trainer's are
    rollouts, so a rollout split at a prefix break has one ratio over all its tokens.
    """
    seq_log_ratio = _broadcast_sequence_mean(log_ratio(lp, lp_old, mask), mask, seq_ids)  # [B, T]
    ratio = torch.exp(seq_log_ratio)  # [B, T], s_i on every token of sequence i
    unclipped = ratio * adv  # [B, T]
    clipped_term = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv  # [B, T]
    loss = -torch.minimum(unclipped, clipped_term)  # [B, T]
    clipped = mask & (clipped_term < unclipped)  # [B, T]
    return PolicyLossOutput(torch.where(mask, loss, torch.zeros_like(loss)), clipped)


def tis_weight(
    lp_train_old: torch.Tensor, lp_sampler: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance weight of each sampled token: min(pi_train_old / pi_sampler, C).

    w_t = min(exp(lp_train_old_t - lp_sampler_t), cap) on the mask, 0 elsewhere; no gradient.
    `lp_sampler` is the logprob the sampler reported for the token it drew (`TrainBatch.old_logprobs`)
    and `lp_train_old` the trainer's own logprob of that token under the adapter that sampled it
    (the trainer's recomputation, detached). A fast sampler (int8 or bf16 weights, another
    engine's kernels) draws from pi_sampler, not from the pi_train_old the trainer's PPO ratio is
    taken against; weighting each token's loss by w_t corrects the expectation back to
    pi_train_old, and truncating at C bounds the variance the rare large ratios would add
    (Ionides 2008, "Truncated importance sampling", J. Comput. Graph. Stat. 17(2); applied to RL
    with fast samplers by Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training", the FlashRL report, which uses C = 2). Where sampler and trainer
    agree, w_t = 1 for any C >= 1.

    >>> tis_weight(torch.tensor([[-1.0, -1.0, -0.5]]), torch.tensor([[-1.0, -2.0, -0.4]]),
    ...            torch.tensor([[True, True, True]]), 2.0).tolist()  # [1, min(e, 2), e^-0.1]
    [[1.0, 2.0, 0.904837429523468]]
    """
    ratio = torch.exp(log_ratio(lp_train_old.detach(), lp_sampler, mask))  # [B, T], 1 off the mask
    weight = torch.clamp(ratio, max=cap)  # [B, T]
    return torch.where(mask, weight, torch.zeros_like(weight))


POLICY_LOSSES: dict[str, PolicyLoss] = {"ppo": ppo_clip, "cispo": cispo, "gspo": gspo}
"""Per-token policy losses by config name (DAPO is "ppo" with eps_low=0.2, eps_high=0.28)."""


def kl_penalty(
    lp: torch.Tensor, lp_ref: torch.Tensor, kind: KLKind, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-token KL penalty from tokens sampled by pi, with d = lp_ref - lp = log(pi_ref / pi) at the token.

    Values, as estimates of KL(pi || pi_ref) (Schulman 2020, "Approximating KL divergence"):
    k1 = -d (unbiased, can be negative, high variance); k2 = d^2 / 2 (biased, exact to second order
    in d, always >= 0); k3 = exp(d) - d - 1 (unbiased, always >= 0, low variance).

    Differentiated as a loss (through lp, the sampled tokens held fixed), their expected gradients
    on-policy are not all the gradient of what they estimate (Tang & Munos 2025, "On a few pitfalls
    in KL divergence gradient estimation for RL", arXiv 2506.09477):
    - k1: grad = grad lp, and E_pi[grad log pi] = 0: no expected gradient at all, only noise.
    - k2: grad = (lp - lp_ref) grad lp, whose expectation is grad KL(pi || pi_ref), the penalty
      the KL term is meant to be (also Liu et al. 2025, arXiv 2510.01555: "k2 as loss" equals
      "k1 in reward" on-policy).
    - k3 (GRPO's, Shao et al. 2024): grad = (1 - pi_ref / pi) grad lp, whose expectation is
      -E_{pi_ref}[grad log pi] = grad KL(pi_ref || pi): the other direction, which pulls pi to
      cover pi_ref's tokens rather than to stay where pi_ref is likely.
    Each is per token: its gradient is that of the next-token KL at each sampled context, with the
    contexts held fixed. The sequence KL also moves through the later contexts a token leads to,
    which no per-token loss sees (Tang & Munos, the sequential pitfall). Off-policy samples (a
    batch reused for several optimizer steps) would need importance weights, which are not applied.

    `[B, T] -> [B, T]`. With `mask`, d is set to 0 off the mask before anything is exponentiated,
    so prompt, tool text and padding give 0 whatever lp and lp_ref hold there (exp(d) of a large
    off-mask d would overflow to inf, and 0 * inf in the backward turns every gradient into NaN).
    lp_ref comes from the same model under the reference policy (the starting adapter or the base).
    """
    d = lp_ref - lp  # [B, T]
    if mask is not None:
        d = torch.where(mask, d, torch.zeros_like(d))  # [B, T]
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        return torch.exp(d) - d - 1.0
    raise ValueError(f"unknown KL estimator {kind!r}; allowed: k1, k2, k3")


def aggregate(
    token_loss: torch.Tensor,
    mask: torch.Tensor,
    seq_ids: torch.Tensor,
    mode: AggregationMode,
    max_completion_tokens: int,
    *,
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    num_rollouts: int | None = None,
) -> torch.Tensor:
    """Reduce per-token losses [B, T] to a scalar.

    - "token_mean" (DAPO): sum of token losses / number of sampled tokens.
    - "sequence_mean" (original GRPO): mean over sequences of each sequence's token mean;
      biased toward long wrong answers (a long sequence's tokens each weigh less).
    - "constant" (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783): sum / (num_rollouts *
      max_completion_tokens), the same number at every step, so every token weighs the same
      whatever its sequence's length and whatever else the step held. The paper divides by all
      G x L of the batch, groups with zero advantage included: pass the step's whole rollout
      count as `num_rollouts`, not only the sequences trained on, or a step whose zero-variance
      groups were dropped would take a larger step. `max_completion_tokens` is the per-turn
      budget (`rollout.max_tokens`): a multi-turn trajectory may hold more sampled tokens than
      it, and each weighs the same 1 / (num_rollouts * max_completion_tokens) as a one-turn one's.

    The counts default to this batch's (`num_rollouts` to `num_sequences`). When one optimizer
    step is split into several micro batches, pass the whole step's `num_tokens` /
    `num_sequences` / `num_rollouts` so that the micro-batch losses add up to the whole step's
    loss (sequences never straddle micro batches).
    """
    masked = torch.where(mask, token_loss, torch.zeros_like(token_loss))  # [B, T]
    seq_tokens = _sequence_counts(mask, seq_ids)  # [S]
    if num_sequences is None:
        num_sequences = int((seq_tokens > 0).sum())
    match mode:
        case "token_mean":
            denom = int(mask.sum()) if num_tokens is None else num_tokens
            return masked.sum() / max(denom, 1)
        case "sequence_mean":
            per_token_len = seq_tokens.clamp(min=1)[seq_ids.clamp(min=0)]  # [B, T]
            return (masked / per_token_len).sum() / max(num_sequences, 1)
        case "constant":
            if max_completion_tokens < 1:
                raise ValueError(f"max_completion_tokens must be >= 1, got {max_completion_tokens}")
            rollouts = num_sequences if num_rollouts is None else num_rollouts
            return masked.sum() / (max(rollouts, 1) * max_completion_tokens)
    raise ValueError(f"unknown loss aggregation {mode!r}; allowed: token_mean, sequence_mean, constant")


def compute_loss(
    lp: torch.Tensor,
    lp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    seq_ids: torch.Tensor,
    *,
    policy_loss: str,
    eps_low: float,
    eps_high: float,
    aggregation: AggregationMode,
    max_completion_tokens: int,
    lp_ref: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_kind: KLKind = "k3",
    num_sequences: int | None = None,
    num_tokens: int | None = None,
    num_rollouts: int | None = None,
    tis_cap: float | None = None,
    lp_train_old: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The training loss: aggregate(policy_loss_t + beta * KL_t), and its per-batch statistics.

    With `tis_cap` C (a sampler that is not the trainer's function, e.g. int8 weights), the
    policy loss is taken against the trainer's own old logprobs and each token's is weighted by
    `tis_weight`: l_t = w_t * policy_loss_t(lp, lp_train_old), w_t = min(pi_train_old /
    pi_sampler, C) (Yao et al. 2025). `lp_train_old` [B, T] is the trainer's logprob of each
    token under the adapter version that sampled it (`training.old_policy`); None: every token was
    sampled by the adapter being trained, whose logprob is this forward's, lp_train_old = sg(lp),
    so the PPO ratio is 1 in value and the gradient is w_t A_t d(lp_t). A stale token's ratio
    exp(lp - lp_train_old) is clipped as PPO's. Without `tis_cap`, the sampler's logprobs are the
    old policy's (the ratio absorbs the mismatch, unweighted) and `lp_train_old` is refused.

    Stats (means over this batch's sampled tokens):
    `clip_fraction` (share of tokens with a clipped ratio), `ratio_mean` (mean rho_t),
    `kl_mean` (mean k3 estimate of KL(pi || pi_ref), unbiased and >= 0, whichever `kl_kind` the
    loss uses; present when `lp_ref` is given),
    `mismatch_k1_mean` / `mismatch_k3_mean` (k1 / k3 estimates of KL(sampler || trainer) from
    lp_old vs lp; near zero when sampler and trainer agree), `mismatch_abs_max`
    (max |lp - lp_old|), `policy_loss` and `kl_loss` (the aggregated parts), `num_tokens`; with
    `tis_cap`, `tis_weight_mean` and `tis_capped_fraction` (share of tokens whose weight is C).
    The mismatch stats measure sampler against trainer on a batch's first optimizer step;
    on later steps of the same batch they also include the policy's own change.
    """
    settings = Loss(
        policy_loss=policy_loss,
        eps_low=eps_low,
        eps_high=eps_high,
        aggregation=aggregation,
        max_completion_tokens=max_completion_tokens,
        beta=beta,
        kl_kind=kl_kind,
        rollouts_per_step=num_rollouts,
        tis_cap=tis_cap,
    )
    counts = {"num_sequences": num_sequences, "num_tokens": num_tokens}
    return _loss_and_stats(settings, lp, lp_old, adv, mask, seq_ids, counts, lp_ref, lp_train_old)


def _loss_and_stats(
    settings: Loss,
    lp: torch.Tensor,
    lp_old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    seq_ids: torch.Tensor,
    counts: dict[str, int | None],
    lp_ref: torch.Tensor | None,
    lp_train_old: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """`compute_loss` on settings already checked (a `Loss` checks its own when built); only the
    tensors this call passes are checked against them here."""
    s = settings
    if s.beta != 0.0 and lp_ref is None:
        raise ValueError(
            f"beta={s.beta} needs reference logprobs lp_ref (the reference policy's); pass them or set beta=0"
        )
    if lp_train_old is not None and s.tis_cap is None:
        raise ValueError("lp_train_old is the old policy of truncated importance sampling: it needs tis_cap")
    ratio_old = lp_old  # [B, T]: the old policy's logprobs, the sampler's without TIS
    if s.tis_cap is not None:
        ratio_old = lp.detach() if lp_train_old is None else lp_train_old.detach()  # pi_train_old's
    out = POLICY_LOSSES[s.policy_loss](
        lp, ratio_old, adv, mask, seq_ids, eps_low=s.eps_low, eps_high=s.eps_high
    )
    token_loss = out.loss  # [B, T]
    weight, cap = None, s.tis_cap
    if cap is not None:
        weight = tis_weight(ratio_old, lp_old, mask, cap)  # [B, T]
        token_loss = weight * token_loss
    counts = {**counts, "num_rollouts": s.rollouts_per_step}
    policy_part = aggregate(token_loss, mask, seq_ids, s.aggregation, s.max_completion_tokens, **counts)
    total = policy_part
    stats = _ratio_stats(lp.detach(), lp_old, mask, out.clipped)
    if weight is not None and cap is not None:
        stats["tis_weight_mean"] = _masked_mean(weight, mask)
        stats["tis_capped_fraction"] = _masked_mean((weight >= cap).float(), mask)
    stats["policy_loss"] = float(policy_part.detach())
    if lp_ref is not None:
        stats["kl_mean"] = _masked_mean(kl_penalty(lp.detach(), lp_ref, "k3", mask), mask)
        if s.beta != 0.0:
            kl = kl_penalty(lp, lp_ref, s.kl_kind, mask)  # [B, T]
            kl_part = aggregate(kl, mask, seq_ids, s.aggregation, s.max_completion_tokens, **counts)
            total = total + s.beta * kl_part
            stats["kl_loss"] = float(kl_part.detach())
    return total, stats


class StepCounts(NamedTuple):
    """The whole optimizer step's normalizers, passed with each of its micro-batches (see `aggregate`)."""

    num_sequences: int
    """The loss's sequences trained this step: rollouts (one split at a prefix break counts once)."""
    num_tokens: int
    """Sampled tokens trained this step."""


@dataclass(frozen=True)
class Loss:
    """`compute_loss` with one run's settings: called with a micro-batch's tensors and the step's counts.

    `loss(lp, lp_old, adv, mask, seq_ids, counts=..., lp_ref=...)` returns (loss, stats) exactly as
    `compute_loss` with `policy_loss`, the clip range, `aggregation`, `beta` and `kl_kind` set here,
    `num_rollouts = rollouts_per_step` (Dr. GRPO's constant counts every rollout the step asked
    for), `tis_cap` (None: no importance correction) and the step's `counts` (None: this batch's
    own). `lp_ref` is needed when `beta` > 0; `lp_train_old` (with `tis_cap`) where tokens were
    sampled by an earlier adapter version than the one trained.

    The settings are checked here, once, when the loss is built (a one-line ValueError naming the
    setting and what is allowed); `compute_loss` builds one from its keywords.
    """

    policy_loss: str
    eps_low: float
    eps_high: float
    aggregation: AggregationMode
    max_completion_tokens: int
    beta: float = 0.0
    kl_kind: KLKind = "k3"
    rollouts_per_step: int | None = None
    tis_cap: float | None = None

    def __post_init__(self) -> None:
        if self.policy_loss not in POLICY_LOSSES:
            raise ValueError(
                f"unknown policy loss {self.policy_loss!r}; allowed: {', '.join(sorted(POLICY_LOSSES))}"
            )
        if self.aggregation not in get_args(AggregationMode):
            raise ValueError(
                f"unknown loss aggregation {self.aggregation!r}; allowed: {', '.join(get_args(AggregationMode))}"
            )
        if self.kl_kind not in get_args(KLKind):
            raise ValueError(f"unknown KL estimator {self.kl_kind!r}; allowed: {', '.join(get_args(KLKind))}")
        if self.tis_cap is not None and not self.tis_cap >= 1.0:
            raise ValueError(
                f"tis_cap={self.tis_cap}: the truncation C must be >= 1 (a weight of 1 is no correction)"
            )

    @property
    def needs_reference(self) -> bool:
        """The KL penalty is on: each micro-batch needs `lp_ref`, its logprobs under the reference
        policy (`training.step.reference_weights`: the starting adapter or the base model)."""
        return self.beta != 0.0

    def __call__(
        self,
        lp: torch.Tensor,
        lp_old: torch.Tensor,
        adv: torch.Tensor,
        mask: torch.Tensor,
        seq_ids: torch.Tensor,
        *,
        counts: StepCounts | None = None,
        lp_ref: torch.Tensor | None = None,
        lp_train_old: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        step: dict[str, int | None] = (
            dict(counts._asdict()) if counts else {"num_sequences": None, "num_tokens": None}
        )
        return _loss_and_stats(self, lp, lp_old, adv, mask, seq_ids, step, lp_ref, lp_train_old)


def build_loss(
    algorithm: AlgorithmConfig, *, max_completion_tokens: int, rollouts_per_step: int | None = None
) -> Loss:
    """The run's loss from its `[algorithm]` section; `max_completion_tokens` is `rollout.max_tokens`
    and `rollouts_per_step` `groups_per_step x group_size` (both used by the constant aggregation)."""
    return Loss(
        policy_loss=algorithm.loss,
        eps_low=algorithm.eps_low,
        eps_high=algorithm.eps_high,
        aggregation=algorithm.aggregation,
        max_completion_tokens=max_completion_tokens,
        beta=algorithm.kl_beta,
        kl_kind=algorithm.kl_kind,
        rollouts_per_step=rollouts_per_step,
        tis_cap=algorithm.tis_cap,
    )


def _ratio_stats(
    lp: torch.Tensor, lp_old: torch.Tensor, mask: torch.Tensor, clipped: torch.Tensor
) -> dict[str, float]:
    """Clip fraction, mean ratio and sampler/trainer mismatch over the sampled tokens.

    The mismatch is taken in float64, k3 as expm1(d) - d: a float32 sampler and trainer differ by
    |d| ~ 1e-5, whose k3 (~ d^2 / 2 ~ 5e-11) is far below float32's resolution at 1, so
    `exp(d) - d - 1` in float32 gives rounding noise (0.0, or even a negative "KL") for any
    mismatch under ~3e-4, and the statistic could not tell a float32 sampler from a stale one.
    """
    diff = log_ratio(lp, lp_old, mask).double()  # [B, T], log(trainer / sampler)
    return {
        "clip_fraction": _masked_mean(clipped.float(), mask),
        "ratio_mean": _masked_mean(torch.exp(diff), mask),
        "mismatch_k1_mean": _masked_mean(-diff, mask),
        "mismatch_k3_mean": _masked_mean(torch.expm1(diff) - diff, mask),
        "mismatch_abs_max": float(diff.abs().max()) if diff.numel() else 0.0,
        "num_tokens": float(mask.sum()),
    }


def _sequence_counts(mask: torch.Tensor, seq_ids: torch.Tensor) -> torch.Tensor:
    """Number of sampled tokens of each sequence id 0..S-1: [B, T] -> [S]."""
    num = int(seq_ids.max()) + 1 if seq_ids.numel() else 0
    idx = seq_ids.clamp(min=0).flatten()  # [B*T]
    return torch.zeros(max(num, 1), dtype=torch.long, device=mask.device).index_add_(
        0, idx, mask.flatten().long()
    )


def _broadcast_sequence_mean(values: torch.Tensor, mask: torch.Tensor, seq_ids: torch.Tensor) -> torch.Tensor:
    """Each token gets the mean of `values` over its sequence's sampled tokens: [B, T] -> [B, T]."""
    counts = _sequence_counts(mask, seq_ids).clamp(min=1)  # [S]
    idx = seq_ids.clamp(min=0)  # [B, T]
    masked = torch.where(mask, values, torch.zeros_like(values))  # [B, T]
    sums = torch.zeros(counts.shape[0], dtype=values.dtype, device=values.device)  # [S]
    sums = sums.index_add(0, idx.flatten(), masked.flatten())  # [S]
    return (sums / counts)[idx]  # [B, T]


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    n = int(mask.sum())
    return float(torch.where(mask, values, torch.zeros_like(values)).sum() / n) if n else 0.0
