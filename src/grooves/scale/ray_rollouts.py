"""Rollouts on Ray: the user's rollout function runs in Ray actors and calls the policy over HTTP.

One process runs the trainer and the policy; rollouts (agent code, tool calls, environments)
often need more CPU than that process has left, or more machines. Here each rollout runs in a
Ray actor with its own `openai.AsyncOpenAI` client pointed at the policy's HTTP server
(`PolicyServer`), so concurrency grows with the number of actors and machines while the user's
`async def rollout(model, scenario)` stays exactly as it is.

`RayRolloutRunner.rollout` has the task-rollout signature, so the trainer's `gather` keeps doing
all the scheduling: concurrency limit, per-rollout seeds, progress, failure accounting. For each
rollout it receives the `ModelHandle` that `gather` derived (its seed depends on step, group and
rollout index, not on scheduling), sends the handle's settings and the scenario to an actor, and
gets the trajectory back as JSON. The actor rebuilds the same handle around its own client, so
the requests, and with seeded sampling the trajectories, are the ones the in-process runner
produces. A rollout that raises is recorded in the actor the way `gather` records it locally.

Ray starts locally (`ray.init()`) unless an address is given (`auto`, `ray://head:10001`). The
function and the task object it belongs to travel to the actors by pickling, so keep live
resources (connections, open files) out of the task object or open them inside `rollout`. The
module that defines the function travels by value (its code, not its import path), so a task
written in a script or a test file runs on workers that could not import it; the libraries that
module imports must be installed where the workers run.
"""

from __future__ import annotations

import inspect
import itertools
import secrets
import traceback
from typing import Any

import ray

from grooves.core.trajectory import Trajectory
from grooves.rollouts.gather import RolloutFn
from grooves.rollouts.handle import ModelHandle
from grooves.scale.policy_server import PolicyServer


@ray.remote
class RolloutWorker:
    """A Ray actor running rollouts concurrently on its own event loop (an async actor)."""

    def __init__(self, rollout: RolloutFn, base_url: str, api_key: str = "grooves"):
        self.rollout = rollout
        self.base_url = base_url
        self.api_key = api_key
        self._client = None

    def _get_client(self):
        if self._client is None:
            from openai import AsyncOpenAI

            self._client = AsyncOpenAI(
                base_url=self.base_url, api_key=self.api_key, max_retries=0, timeout=600.0
            )
        return self._client

    async def run(self, spec: dict[str, Any], scenario: dict[str, Any]) -> str:
        """One rollout with the handle described by `spec`; the trajectory as JSON."""
        model = ModelHandle(
            self._get_client(),
            spec["name"],
            spec["temperature"],
            spec["top_p"],
            spec["max_tokens"],
            seed=spec["seed"],
        )
        try:
            traj = await self.rollout(model, scenario)
            if not isinstance(traj, Trajectory):
                raise TypeError(f"rollout must return a Trajectory, got {type(traj).__name__}")
        except Exception as exc:  # a bad rollout is data, not a crash: recorded as gather records it
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            traj = Trajectory(error=last, metadata={"scenario": scenario})
        return traj.model_dump_json()


def _send_code_by_value(rollout: RolloutFn) -> None:
    """Pickle the rollout's defining module by value unless it is grooves' own (installed on every worker)."""
    module = inspect.getmodule(rollout)
    if module is None or module.__name__ == "__main__" or module.__name__.split(".")[0] == "grooves":
        return  # __main__ already travels by value
    ray.cloudpickle.register_pickle_by_value(module)


def handle_spec(model: ModelHandle) -> dict[str, Any]:
    """What an actor needs to rebuild `model` around its own client (the seed is already per rollout)."""
    return {
        "name": model.name,
        "temperature": model.temperature,
        "top_p": model.top_p,
        "max_tokens": model.max_tokens,
        "seed": model.seed,
    }


class RayRolloutRunner:
    """Sends each rollout to one of `num_workers` actors, round robin."""

    def __init__(
        self,
        rollout: RolloutFn,
        base_url: str,
        *,
        address: str | None = None,
        num_workers: int = 2,
        max_concurrency: int = 256,
        api_key: str = "grooves",
    ):
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(address=address, include_dashboard=False, log_to_driver=True)
        _send_code_by_value(rollout)
        try:
            # ray's stubs type the @ray.remote class as the class itself, without its actor methods
            self._workers = [
                RolloutWorker.options(max_concurrency=max_concurrency).remote(rollout, base_url, api_key)  # type: ignore[attr-defined]
                for _ in range(num_workers)
            ]
        except TypeError as exc:  # cloudpickle could not serialize the function or its task object
            raise TypeError(
                f"the rollout function could not be sent to Ray workers ({exc}); keep connections and other live "
                "resources out of the task object, or open them inside rollout()"
            ) from exc
        self._turn = itertools.count()

    async def rollout(self, model: ModelHandle, scenario: dict[str, Any]) -> Trajectory:
        worker = self._workers[next(self._turn) % len(self._workers)]
        data = await worker.run.remote(handle_spec(model), dict(scenario))
        return Trajectory.model_validate_json(data)

    def close(self) -> None:
        for w in self._workers:
            ray.kill(w)
        self._workers = []
        if self._owns_ray:
            ray.shutdown()


class RayRollouts:
    """The trainer's Ray runner: a policy HTTP server plus the actors that call it."""

    def __init__(self, server: PolicyServer, runner: RayRolloutRunner, owns_ray: bool):
        self.server = server
        self.runner = runner
        self.rollout = runner.rollout
        self._owns_ray = owns_ray

    @classmethod
    def start(
        cls, rollout: RolloutFn, policy, *, address: str | None, num_workers: int, host: str
    ) -> RayRollouts:
        owns_ray = not ray.is_initialized()
        if owns_ray:
            ray.init(address=address, include_dashboard=False)
        # on a cluster the server listens on all interfaces and the actors call this node's address
        advertise = ray.util.get_node_ip_address() if host in ("0.0.0.0", "::") else host
        # a key drawn for this run: the server may listen on every interface, and only the actors have it
        key = secrets.token_urlsafe(24)
        server = PolicyServer(policy, host=host, advertise=advertise, api_key=key)
        return cls(
            server, RayRolloutRunner(rollout, server.url, num_workers=num_workers, api_key=key), owns_ray
        )

    def close(self) -> None:
        self.runner.close()
        self.server.close()
        if self._owns_ray:
            ray.shutdown()
