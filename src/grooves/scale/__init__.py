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

from grooves.config import RolloutConfig
from grooves.rollouts.gather import RolloutFn


class RolloutRunner(Protocol):
    rollout: RolloutFn
    """`async (model, scenario) -> Trajectory`, what `gather` calls once per rollout."""

    def close(self) -> None: ...


class LocalRollouts:
    """Rollouts in this process's event loop: the task's own function, unchanged."""

    def __init__(self, rollout: RolloutFn):
        self.rollout = rollout

    def close(self) -> None:
        return None


def start_rollouts(config: RolloutConfig, rollout: RolloutFn, policy: Any) -> RolloutRunner:
    """The runner `config.runner` names, ready to use; `close()` it when the run ends."""
    if config.runner == "local":
        return LocalRollouts(rollout)
    from grooves.scale.ray_rollouts import RayRollouts

    return RayRollouts.start(
        rollout, policy, address=config.ray_address, num_workers=config.ray_workers, host=config.server_host
    )
