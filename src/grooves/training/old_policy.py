"""The trainer's logprobs under the adapter version that sampled each token, for truncated
importance sampling with rollouts ahead of the trainer (`algorithm.tis_cap` with
`rollout.max_staleness > 0`).

Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training") corrects a sampler whose logprobs `lp_s` are not the trainer's function
(int8 or bf16 weights, vLLM's kernels): each token's loss is weighted by
w_t = min(exp(lp_old_tr - lp_s), C), and the PPO ratio is rho_t = exp(lp - lp_old_tr), clipped,
where lp_old_tr is the trainer's own logprob of the token under the adapter version v that
sampled it. On-policy, v is the live adapter and lp_old_tr = sg(lp). A turn sampled k versions
ago needs v's weights: `AdapterHistory` keeps the trainable adapter's weights of the last k
versions (a LoRA adapter is a few MB; peft's state-dict functions read and write them), and
`stale_logprobs` runs a no-grad forward under each stale version a micro-batch holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch

from grooves.core.tokenize import TrainBatch


class MissingVersions(ValueError):
    """Turns sampled by adapter versions whose weights the trainer no longer holds (a restarted
    service): raised before a step changes anything."""


class AdapterHistory:
    """The trained adapter's weights at its last `keep` + 1 versions (CPU copies, peft's state-dict
    keys): a step of live version L takes turns of versions L - keep .. L."""

    def __init__(self, keep: int):
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (rollout.max_staleness), got {keep}")
        self.keep = keep
        self._weights: dict[int, dict[str, torch.Tensor]] = {}

    @property
    def versions(self) -> list[int]:
        return sorted(self._weights)

    def record(self, model: torch.nn.Module, version: int) -> None:
        """Keep `model`'s adapter as `version` (the live one, before an optimizer step changes it);
        versions more than `keep` before it are dropped, as no turn the step takes is that stale."""
        self._weights[version] = _snapshot(model)
        for old in [v for v in self._weights if v < version - self.keep]:
            del self._weights[old]

    def load(self, version: int, folder: str | Path) -> None:
        """Take `version`'s weights from an adapter folder peft saved (a resumed run's saved versions)."""
        from peft.utils import load_peft_weights

        self._weights[version] = load_peft_weights(str(folder), device="cpu")

    def require(self, versions: Iterable[int]) -> None:
        """Raise `MissingVersions` naming the versions of `versions` whose weights are not kept."""
        missing = sorted(set(versions) - set(self._weights))
        if missing:
            raise MissingVersions(
                f"turns sampled by adapter versions {missing}, whose weights this trainer no longer holds "
                f"(it keeps {self.versions}); truncated importance sampling (algorithm.tis_cap) needs the "
                "weights that sampled each turn: sample those turns again"
            )

    @contextlib.contextmanager
    def weights(self, model: torch.nn.Module, version: int) -> Iterator[None]:
        """Inside: `model`'s trained adapter holds `version`'s weights (copied in place, then back)."""
        from peft.utils import set_peft_model_state_dict

        live = _snapshot(model)
        set_peft_model_state_dict(model, self._weights[version])
        try:
            yield
        finally:
            set_peft_model_state_dict(model, live)


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from peft.utils import get_peft_model_state_dict

    # no embedding layers: "auto" would look the base model's vocabulary up on the hub
    state = get_peft_model_state_dict(model, save_embedding_layers=False)
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def stale_versions(batch: TrainBatch, live: int) -> list[int]:
    """The adapter versions other than `live` that sampled tokens of `batch`."""
    versions = batch.versions
    assert versions is not None  # TrainBatch.__post_init__ fills it
    stale = batch.sampled_mask & (versions >= 0) & (versions != live)  # [B, T]
    return sorted({int(v) for v in versions[stale].tolist()})


def stale_logprobs(
    model: torch.nn.Module,
    batch: TrainBatch,
    live: int,
    history: AdapterHistory,
    forward: Callable[[], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(lp_old_tr [B, T], where it holds [B, T] bool) for the tokens of `batch` that an adapter
    version other than `live` sampled: `forward()` (the batch's logprobs under the model's weights
    at the call) run without grad under each such version's weights. None when every token is the
    live version's (there lp_old_tr = sg(lp), which `old_policy_logprobs` takes). Run it before
    the batch's own forward: the weights are swapped in place, which would invalidate what a
    graph saved for its backward."""
    stale = stale_versions(batch, live)
    if not stale:
        return None
    history.require(stale)
    out = torch.zeros_like(batch.old_logprobs)  # [B, T]
    where = torch.zeros_like(batch.sampled_mask)  # [B, T]
    with torch.no_grad():
        for version in stale:
            with history.weights(model, version):
                lp = forward()  # [B, T]
            mine = batch.sampled_mask & (batch.versions == version)  # [B, T]
            out = torch.where(mine, lp, out)
            where |= mine
    return out, where


def old_policy_logprobs(lp: torch.Tensor, stale: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """lp_old_tr [B, T]: `stale_logprobs`' values where it has them, sg(lp) elsewhere."""
    if stale is None:
        return lp.detach()
    values, where = stale
    return torch.where(where, values, lp.detach())
