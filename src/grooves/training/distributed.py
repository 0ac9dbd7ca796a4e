"""Data-parallel training: one LoRA adapter trained by N processes with `torch.distributed`.

    torchrun --standalone --nproc-per-node N -m grooves train RUN.toml [--resume]

torchrun starts N copies of the command with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT set. Every rank builds the whole run (its own copy of the base model and the adapter
on its device, its own server and sampler, the same scenario stream), and the ranks meet at a few
collectives per step:

- rollouts: rank r runs a contiguous share of the step's rollouts, flat indices
  [r n / N, (r + 1) n / N) of the n = groups x group_size (`share`), on its own sampler, with the
  same per-rollout seeds one process would use; then every rank receives all of them, in the
  order one process would have them (`merge_groups`: one all_gather of the trajectories);
- scoring (judges, reward models, gates): on rank 0 for the whole step, so each judge is asked
  once, and the scored groups are sent to the others (`on_main`);
- training: every rank computes the advantages and token sequences of the whole step (cheap, and
  identical everywhere), then the loss and backward of a contiguous share of the sequences,
  balanced by tokens (`shard`). The loss is normalised by the whole step's counts, so the sum of
  the ranks' gradients is the gradient of one process: one all_reduce (sum) of the flattened LoRA
  gradients (`sum_gradients`), then every rank clips and steps alike, and the adapters stay equal;
- the run folder: rank 0 holds the lock and writes metrics, samples, checkpoints and the report;
  the watch runs there. On `--resume`, rank 0 picks the checkpoint and every rank loads it.

Why torchrun and not Ray: torchrun comes with torch (nothing to install, also on a GPU machine
without a package index), gives torch.distributed its environment on one node or many
(`--nnodes`, rendezvous), and ends every rank when one dies, which is what a kill -9 of one rank
needs before `--resume`. Ray's process launch (Ray Train) would make Ray a dependency of
training and move the trainer into Ray actors; the Ray support grooves has spreads rollouts, and
it still does, per rank, under torchrun (`rollout.runner = "ray"`).

Why not `DistributedDataParallel`: DDP all-reduces during every backward unless told not to, needs
the same number of forwards on every rank (the micro-batches of a rank's share vary), and wraps a
model the sampler also uses. A LoRA adapter's gradients are a few MB: one all_reduce after the
rank's last micro-batch costs what DDP's buckets would, and the step stays the step function
that one process runs (`training.step.optimize`, with `sync=`). The base model must fit one device;
sharding it (FSDP) is not built.

NCCL when every rank has a GPU of its own (`model.device = "cuda"` gives rank r `cuda:<LOCAL_RANK>`);
gloo otherwise: on CPU, and when ranks share a GPU (an explicit `cuda:N`, or more ranks than GPUs),
which NCCL refuses. A world of one (no torchrun) is `DataParallel.single()`: every method is the
identity and torch.distributed is never touched.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import torch

from grooves.core.tokenize import TrainSequence, rollouts
from grooves.core.trajectory import TrajectoryGroup

T = TypeVar("T")

TIMEOUT = timedelta(minutes=30)
"""How long a collective waits for the other ranks (a rank scoring a long validation meanwhile)."""


class DataParallel:
    """This process's place among the ranks of a data-parallel run (see the module docstring)."""

    def __init__(self, rank: int = 0, world: int = 1, local_rank: int = 0, local_world: int = 1):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in 0..{world - 1}")
        self.rank, self.world = rank, world
        self.local_rank, self.local_world = local_rank, local_world
        self.backend: str | None = None

    @classmethod
    def single(cls) -> DataParallel:
        return cls()

    @classmethod
    def from_env(cls) -> DataParallel:
        """The place torchrun gives this process (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE);
        a world of one without them."""
        env = os.environ
        world = int(env.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls.single()
        local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
        return cls(int(env["RANK"]), world, int(env.get("LOCAL_RANK", "0")), local_world)

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes the run folder."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    # ---- start and end ------------------------------------------------------------------------
    def device(self, device: str) -> str:
        """The device of this rank for the run file's `model.device`: `cuda` becomes this rank's GPU
        (`cuda:<LOCAL_RANK>`, shared round robin when there are fewer GPUs than ranks); an explicit
        `cuda:N`, `cpu` and the others stay as they are."""
        if not self.active or device != "cuda":
            return device
        count = max(torch.cuda.device_count(), 1)
        return f"cuda:{self.local_rank % count}"

    def start(self, device: str) -> None:
        """Join the process group (torchrun's rendezvous, `env://`); NCCL or gloo as the module says."""
        if not self.active:
            return
        import torch.distributed as dist

        own_gpu = device == "cuda" and torch.cuda.device_count() >= self.local_world
        self.backend = "nccl" if own_gpu and dist.is_nccl_available() else "gloo"
        if self.backend == "nccl":
            torch.cuda.set_device(self.local_rank)
        if not dist.is_initialized():
            dist.init_process_group(self.backend, rank=self.rank, world_size=self.world, timeout=TIMEOUT)

    def close(self) -> None:
        if self.active:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()

    # ---- objects --------------------------------------------------------------------------------
    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj`, on every rank (others pass anything, e.g. None)."""
        if not self.active:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.active:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def on_main(self, fn: Callable[[], T]) -> T:
        """`fn()` on rank 0, its result (or the exception it raised) on every rank."""
        if not self.active:
            return fn()
        result: tuple[bool, Any] = (True, None)
        if self.main:
            try:
                result = (True, fn())
            except Exception as exc:  # the other ranks raise it too, instead of waiting forever
                result = (False, exc)
        ok, value = self.broadcast(result)
        if not ok:
            raise value
        return value

    # ---- rollouts -------------------------------------------------------------------------------
    def share(self, n: int) -> range:
        """This rank's contiguous share of `n` items: [rank n / N, (rank + 1) n / N)."""
        return range(self.rank * n // self.world, (self.rank + 1) * n // self.world)

    def merge_groups(self, groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
        """Each rank's groups holding its share of the rollouts (`share`) -> the whole groups, with
        every trajectory in the order of one process (group by group, rollout by rollout)."""
        if not self.active:
            return groups
        parts = self.gather(groups)
        merged = [TrajectoryGroup(scenario=g.scenario) for g in parts[0]]
        for part in parts:  # rank order is flat order: shares are contiguous
            for whole, piece in zip(merged, part, strict=True):
                whole.trajectories.extend(piece.trajectories)
        return merged

    # ---- training -------------------------------------------------------------------------------
    def shard(self, seqs: Sequence[TrainSequence]) -> list[TrainSequence]:
        """This rank's contiguous share of a step's sequences, balanced by tokens.

        The unit is a rollout (`core.tokenize.rollouts`: the sequences of a trajectory split at a
        prefix break go to one rank, since the loss takes each rollout whole). Rollout i goes to rank
        floor(N (c_i + len_i / 2) / C), with c_i the tokens before it and C all tokens: contiguous,
        so a group's members mostly stay on one rank and share their prompt's forward
        (`core.batching`).
        """
        if not self.active:
            return list(seqs)
        total = sum(len(s) for s in seqs)
        mine: list[TrainSequence] = []
        before = 0
        for unit in rollouts(seqs):
            n = sum(len(seqs[i]) for i in unit)
            owner = min(self.world - 1, int(self.world * (before + n / 2) / max(total, 1)))
            if owner == self.rank:
                mine.extend(seqs[i] for i in unit)
            before += n
        return mine

    def sum_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Replace each parameter's gradient by its sum over the ranks (a rank that ran no
        micro-batch adds zeros): one all_reduce of the flattened gradients."""
        if not self.active:
            return
        import torch.distributed as dist

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])  # [sum of numels]
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n

    def broadcast_parameters(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Rank 0's values of `params` on every rank (the adapters start equal however each was made)."""
        if not self.active:
            return
        import torch.distributed as dist

        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, src=0)
