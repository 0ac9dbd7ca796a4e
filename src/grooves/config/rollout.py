"""The `[rollout]` section: how rollouts are sampled and where they run; `[ray]`: how the Ray
runner (`rollout.runner = "ray"`) is deployed.

Ray's deployment settings are a section of their own beside `[rollout]`, as vLLM's are beside
`[model]` (`[vllm]`, used when `model.backend = "vllm"`): `[rollout]` says what a rollout is and
which runner runs it, and is the same on a laptop and a cluster; `[ray]` says where the cluster
is and how many workers it runs, which only the Ray runner reads.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from grooves.config.base import Section


class RolloutConfig(Section):
    group_size: int = Field(8, ge=2)
    """Rollouts per scenario. Advantages are relative to the group: 1 gives no signal."""
    groups_per_step: int = Field(4, ge=1)
    """Scenarios per optimizer step. More = less noisy gradient, slower steps."""
    concurrency: int = Field(64, ge=1)
    """Rollouts in flight at once (requests are batched together by the sampler)."""
    temperature: float = Field(1.0, ge=0, le=2)
    """Sampling temperature. Below ~0.7 groups lose diversity and more of them have zero variance.
    The trainer recomputes each turn's logprobs at the temperature that turn was sampled at (a task
    may ask for another), and a greedy turn (0) at 1, the temperature of the logprobs it reports."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling. Below 1 the sampler and trainer distributions differ (off-policy bias)."""
    max_tokens: int = Field(64, ge=1)
    """Per-turn completion budget; also L in the constant of `aggregation = "constant"` (Dr. GRPO)."""
    max_failure_fraction: float = Field(0.5, ge=0, le=1)
    """Stop the run if more than this fraction of a step's rollouts raise."""
    refill_zero_variance: bool = False
    """Dynamic sampling (DAPO): a group whose rewards are all equal teaches nothing, so draw more
    training scenarios (from the same seeded stream: a resumed run draws the same) until the step
    has `groups_per_step` groups whose rewards differ, or `max_refill_draws` extra scenarios were
    drawn. Each draw costs `group_size` rollouts; the step trains on every group it drew."""
    max_refill_draws: int = Field(8, ge=0)
    """The most extra scenarios one step draws with `refill_zero_variance`: a step costs at most
    (groups_per_step + max_refill_draws) x group_size rollouts. Logged per step as `refill_draws`."""
    zero_variance_warning: float = Field(0.5, ge=0, le=1)
    """Say so on one line (at most once per 10 steps) when at least this fraction of a step's groups
    had all-equal rewards; such steps are logged with `sparse_rewards = 1` and counted in the report.
    With `refill_zero_variance` the line and the flag mean that the refills ran out first."""
    max_staleness: int = Field(0, ge=0)
    """k: rollouts may run up to k steps ahead of the trainer, step t sampled by adapter version
    max(0, t - 1 - k) (`training.pipeline`). 0: strictly on-policy, each step waits for its rollouts
    and they for the step before. k >= 1 overlaps the next steps' rollouts (agent code,
    environments, judges) with the optimizer step, at the price of turns k updates old; the
    loss's ratio to the sampling logprobs corrects for that as for any off-policy sample, and
    `staleness/<j>` logs the share of turns j versions behind. Local rollouts only. A trainable
    model of `grooves serve --train` holds the turns sent to it to the same bound, live - version
    <= k, while the sending loop decides when it samples (docs/service.md)."""
    runner: Literal["local", "ray"] = "local"
    """Where rollouts run. local: in this process (asyncio), enough while the policy is the bottleneck.
    ray: in Ray actors that call the policy over HTTP, for environments that need more CPU than one
    process (or more machines), deployed as `[ray]` says; needs `pip install 'grooves[ray]'`."""

    @model_validator(mode="after")
    def _staleness_runner(self):
        if self.max_staleness and self.runner != "local":
            raise ValueError(
                'rollout.max_staleness > 0 needs rollout.runner = "local" (the Ray runner serves only the live adapter)'
            )
        return self

    @model_validator(mode="after")
    def _refill_on_policy(self):
        if self.refill_zero_variance and self.max_staleness:
            raise ValueError(
                "rollout.refill_zero_variance needs max_staleness = 0 (refills draw after the step's own scenarios)"
            )
        return self


class RayConfig(Section):
    """Where the Ray runner's workers run (`rollout.runner = "ray"`, `grooves.scale`); unused otherwise."""

    address: str | None = None
    """`ray.init(address=...)`: unset starts a local Ray; `auto` or `ray://host:10001` joins a cluster."""
    workers: int = Field(2, ge=1)
    """Rollout actors; each runs many rollouts at once (asyncio), so a few per machine suffice."""
    server_host: str = "127.0.0.1"
    """Where the policy's HTTP server listens for the workers: 127.0.0.1 on one machine; 0.0.0.0 on a
    cluster (workers then call this node's IP)."""
