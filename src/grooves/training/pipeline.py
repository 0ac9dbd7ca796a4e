"""Rollouts ahead of the trainer: bounded staleness (`rollout.max_staleness = k`).

With k = 0 (the default) a step's rollouts start once the previous step's update is live, and
every turn is sampled by the adapter the step then trains: strictly on-policy. With k > 0 the
rollouts of step t are sampled by adapter version

    v(t) = max(0, t - 1 - k)

and start as soon as the trainer has made that version, up to k steps before the trainer gets
to step t: while the trainer updates step s, the rollouts of steps s + 1 .. s + k run. This is
prime-rl's `async_level` (Prime Intellect, INTELLECT-2, arXiv 2505.07291): a fixed lag rather
than "whatever version is live when a request arrives", for two reasons. The loss needs the
sampling logprobs of the policy that sampled (they are the old policy of PPO's ratio, so a
stale turn is corrected like any off-policy sample), and those come with every turn either way;
but a fixed lag makes the version of every turn a function of its step, so a run is the same
however fast each side was, and a resumed run samples the steps that were in flight again with
the same weights and seeds: resume stays exact.

Which weights sample: each version a coming step needs is saved (`save_pretrained`, the adapter
only: a few MB) and served beside the live adapter under its own name, `<name>@v<N>`
(`ModelRoutes.pin`), whose responses report version N. The step's rollouts ask for that name.
The step checks each turn's version (`staleness_stats`, in `step.train_step`): 0 <= live - version <= k.

What overlaps: the sampler and the optimizer step share the policy's lock (one set of weights
on one device), so their batches alternate; what runs beside the optimizer step is everything
else in a rollout (agent code, environments, tool calls, reward code, judges over HTTP) and the
scheduling of the next requests. docs/scaling.md measures it and works out what a GPU gives.

Checkpoints: the rollouts in flight are discarded. A checkpoint of step s also holds the saved
versions that steps s + 1 .. s + k sample with (`checkpoint_versions`), so `--resume` runs those
steps' rollouts again from the same weights and seeds.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from grooves.core.trajectory import TrajectoryGroup
from grooves.policy.base import Policy
from grooves.serve.routing import ModelRoutes

VERSIONS = "versions"
"""The folder of a checkpoint that holds the saved versions the next k steps sample with."""


def sampling_version(step: int, max_staleness: int) -> int:
    """v(t) = max(0, t - 1 - k): the adapter version whose weights sample the rollouts of `step`.

    >>> [sampling_version(t, 0) for t in (1, 2, 3)], [sampling_version(t, 2) for t in (1, 2, 3, 4, 5)]
    ([0, 1, 2], [0, 0, 0, 1, 2])
    """
    return max(0, step - 1 - max_staleness)


def staleness_stats(groups: list[TrajectoryGroup], live: int, max_staleness: int) -> dict[str, float]:
    """How far behind the live adapter (`live`, the version this step updates) each sampled turn was.

    staleness = live - turn.adapter_version, for every turn that records a version; `ValueError`
    when one is negative (sampled by weights the trainer has not made) or above `max_staleness`.
    Returns staleness_mean, staleness_max and the distribution: staleness/<j> = the fraction of
    turns j versions behind, for j = 0 .. max_staleness.

    >>> from grooves.core.trajectory import SampledTurn, Trajectory
    >>> turn = lambda v: SampledTurn(prompt_token_ids=[1], token_ids=[2], logprobs=[0.0], adapter_version=v)
    >>> g = TrajectoryGroup(trajectories=[Trajectory(turns=[turn(3), turn(4)]), Trajectory(turns=[turn(3)])])
    >>> staleness_stats([g], live=4, max_staleness=1)
    {'staleness_mean': 0.6666666666666666, 'staleness_max': 1.0, 'staleness/0': 0.3333333333333333, 'staleness/1': 0.6666666666666666}
    """
    lags = [
        live - t.adapter_version
        for g in groups
        for tr in g.ok
        for t in tr.turns
        if t.adapter_version is not None
    ]
    bad = sorted({live - lag for lag in lags if not 0 <= lag <= max_staleness})
    if bad:
        allowed = live if max_staleness == 0 else f"{max(0, live - max_staleness)}..{live}"
        raise ValueError(
            f"rollouts were sampled by adapter versions {bad}, but the live adapter is {live} and "
            f"rollout.max_staleness = {max_staleness} allows {allowed}"
        )
    n = max(len(lags), 1)
    out = {
        "staleness_mean": sum(lags) / n,
        "staleness_max": float(max(lags, default=0)),
    }
    out.update({f"staleness/{j}": sum(1 for lag in lags if lag == j) / n for j in range(max_staleness + 1)})
    return out


class VersionPins:
    """Saved versions of the training adapter, each served under `<name>@v<N>` while a step needs it.

    `tables` are the adapter tables of the apps that answer the rollouts' requests.
    """

    def __init__(self, policy: Policy, tables: list[ModelRoutes], max_staleness: int):
        self.policy = policy
        self.tables = tables
        self.k = max_staleness
        self._dir = Path(tempfile.mkdtemp(prefix="grooves-versions-"))
        self._served: set[int] = set()

    def name(self, version: int) -> str:
        return f"{self.policy.served_name}@v{version}"

    def path(self, version: int) -> Path:
        return self._dir / f"v{version}"

    def serve(self, version: int) -> str:
        """The model name that samples with `version`: the live adapter is saved first if it is
        that version; an older one must have been saved (or restored from a checkpoint)."""
        if version not in self._served:
            if not (self.path(version) / "adapter_config.json").is_file():
                if version != self.policy.adapters.version:
                    raise RuntimeError(
                        f"adapter version {version} was not saved; the live one is {self.policy.adapters.version}"
                    )
                with self.policy.lock:
                    self.policy.model.save_pretrained(str(self.path(version)), selected_adapters=["default"])
            for table in self.tables:
                table.pin(self.name(version), self.path(version), version)
            self._served.add(version)
        return self.name(version)

    def release(self, below: int) -> None:
        """Stop serving, and forget, the versions below `below` (no coming step samples with them)."""
        for version in sorted(v for v in self._served if v < below):
            for table in self.tables:
                table.remove(self.name(version))
            self._served.discard(version)
        for folder in self._dir.glob("v*"):
            if folder.name[1:].isdigit() and int(folder.name[1:]) < below:
                shutil.rmtree(folder, ignore_errors=True)

    def checkpoint_versions(self, step: int, last: int) -> dict[str, Path]:
        """What a checkpoint of `step` must hold so that a resumed run samples steps step + 1 ..
        step + k with the weights an uninterrupted one uses: {checkpoint path: saved folder}."""
        needed = sorted(
            {sampling_version(t, self.k) for t in range(step + 1, min(step + self.k, last) + 1)} - {step}
        )
        return {f"{VERSIONS}/v{v}": self.path(v) for v in needed}

    def restore(self, checkpoint: Path) -> None:
        """Take the saved versions a checkpoint holds (see `checkpoint_versions`)."""
        for folder in sorted((checkpoint / VERSIONS).glob("v*")):
            shutil.copytree(folder, self._dir / folder.name, dirs_exist_ok=True)

    def restored(self, checkpoint: Path) -> list[int]:
        """The versions a checkpoint holds (`restore` took them; `path(v)` is each one's folder)."""
        return sorted(int(f.name[1:]) for f in (checkpoint / VERSIONS).glob("v*") if f.name[1:].isdigit())

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


Launch = Callable[[int, list[dict[str, Any]], str | None], Awaitable[list[TrajectoryGroup]]]
"""(step, scenarios, model name or None for the live adapter) -> this process's groups of the step."""


class RolloutPipeline:
    """The rollouts of the coming steps, started in step order, up to `max_staleness` steps ahead.

    `take(step)` starts every step whose sampling version exists (v(t) <= the live version) and
    returns `step`'s groups once they are done. Scenarios are taken from the stream when a step
    starts, in step order, so they are the ones a strictly on-policy run takes; `position(step)`
    is the stream's position after `step`'s scenarios, what a checkpoint of `step` records.
    """

    def __init__(
        self,
        *,
        next_step: int,
        last_step: int,
        max_staleness: int,
        per_step: int,
        stream,
        launch: Launch,
        pins: VersionPins | None,
        live_version: Callable[[], int],
    ):
        self.k = max_staleness
        self.last = last_step
        self.per_step = per_step
        self.stream = stream
        self.launch = launch
        self.pins = pins
        self.live_version = live_version
        self._next = next_step
        self._tasks: dict[int, asyncio.Task] = {}
        self._positions: dict[int, int] = {}

    def _fill(self) -> None:
        live = self.live_version()
        while self._next <= self.last and sampling_version(self._next, self.k) <= live:
            step = self._next
            scenarios = [s for _, s in self.stream.take(self.per_step)]
            self._positions[step] = self.stream.position
            name = self.pins.serve(sampling_version(step, self.k)) if self.pins is not None else None
            self._tasks[step] = asyncio.ensure_future(self.launch(step, scenarios, name))
            self._next += 1

    async def take(self, step: int) -> list[TrajectoryGroup]:
        self._fill()
        groups = await self._tasks.pop(step)
        if self.pins is not None:  # the versions only this step and earlier ones sampled with
            self.pins.release(sampling_version(step + 1, self.k))
        return groups

    def position(self, step: int) -> int:
        return self._positions.pop(step)

    async def close(self) -> None:
        """Cancel the rollouts still in flight (a run that ends early, or fails)."""
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - being discarded
                pass
        self._tasks.clear()
        if self.pins is not None:
            self.pins.close()
