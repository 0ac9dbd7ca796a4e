"""Where rollouts run: in this process, or spread over Ray actors on one machine or a cluster.

The trainer asks `start_rollouts` for a runner and passes `runner.rollout` to `gather` in place of
the task's own rollout function. `gather` still schedules, seeds, bounds and counts every rollout;
a runner only decides where one rollout executes. The local runner is the task's function itself;
the Ray runner (`grooves.scale.ray_rollouts`, imported only when chosen, so `import grooves` never
needs Ray) sends each rollout to an actor that calls the policy over HTTP. User code is the same
`async def rollout(model, scenario)` either way.
"""

from __future__ import annotations

from typing import Any, Protocol

from grooves.config import RayConfig
from grooves.rollouts.gather import RolloutFn


class RolloutRunner(Protocol):
    @property
    def rollout(self) -> RolloutFn:
        """`async (model, scenario) -> Trajectory`, what `gather` calls once per rollout."""
        ...

    def close(self) -> None: ...


class LocalRollouts:
    """Rollouts in this process's event loop: the task's own function, unchanged."""

    def __init__(self, rollout: RolloutFn):
        self.rollout = rollout

    def close(self) -> None:
        return None


def start_rollouts(runner: str, ray: RayConfig, rollout: RolloutFn, policy: Any) -> RolloutRunner:
    """The runner `runner` (`rollout.runner`) names, ready to use, the Ray one deployed as `ray`
    (the `[ray]` section) says; `close()` it when the run ends."""
    if runner == "local":
        return LocalRollouts(rollout)
    from grooves.scale.ray_rollouts import RayRollouts

    return RayRollouts.start(
        rollout, policy, address=ray.address, num_workers=ray.workers, host=ray.server_host
    )
