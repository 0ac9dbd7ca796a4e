"""One trainable model of the training service: its policy, optimizer, loss and run folder.

A hosted model is what the trainer holds for one run, built the same way (`policy_for` after
`seed_everything(seed)`, `adamw`, `run_loss`), except that its policy wraps the service's shared
base (`policy.shared_base`): its own LoRA adapter, folded weights and speed paths over base
weights held once. A step is the trainer's `train_step` on the submitted groups, then what the
trainer writes: the metrics row, the samples, the checkpoint, the reward curve. The run folder is
a trainer's run folder (`grooves report` reads it), plus `service.json` (tenant, settings) and
`usage.jsonl` (tokens sampled and trained, one line per step).

Randomness: a model's steps draw from a torch RNG state of its own (dropout, if `lora.dropout` is
set), carried from step to step and saved in its checkpoints, so models do not draw from each
other's stream. A model is created from `seed` exactly as the trainer creates its policy (the same
first adapter) and saves a step-0 checkpoint, so it can be selected back to its start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grooves.config import RunConfig, dump_config, load_config
from grooves.core.batching import longest_row
from grooves.core.trajectory import TrajectoryGroup
from grooves.jsonl import read_jsonl, write_jsonl
from grooves.policy import policy_for
from grooves.training.checkpoint import (
    CHECKPOINT_PREFIX,
    TrainState,
    checkpoint_dir,
    checkpoint_problem,
    latest_checkpoint,
    load_checkpoint,
    load_with_fallback,
    save_checkpoint,
    seed_everything,
)
from grooves.training.memory import auto_micro_batch_tokens, pair_tokens
from grooves.training.old_policy import AdapterHistory
from grooves.training.optim import adamw
from grooves.training.runlog import RunLog
from grooves.training.sparse import groups_with_signal
from grooves.training.step import needs_history, reward_stats, run_loss, train_step

SERVICE_FILE = "service.json"
USAGE_FILE = "usage.jsonl"


class HostedModel:
    """A trainable model on the shared base. `step` is both the number of applied steps and the
    live adapter's version. Every change runs under `lock` (an `asyncio.Lock`: one step, select or
    promotion of this model at a time) and, for the weights, under the policy's lock."""

    def __init__(
        self,
        tenant: str,
        name: str,
        config: RunConfig,
        policy,
        optimizer: torch.optim.Optimizer,
        run_dir: Path,
        *,
        rng_state: torch.Tensor,
    ):
        self.tenant, self.name, self.config = tenant, name, config
        self.policy, self.optimizer, self.loss = policy, optimizer, run_loss(config)
        self.history = AdapterHistory(config.rollout.max_staleness) if needs_history(config) else None
        """The adapter's last versions, for truncated importance sampling of stale turns (kept in
        memory only: after a restart, turns sampled before it are refused under `algorithm.tis_cap`)."""
        self.run_dir = run_dir
        self.log = RunLog(run_dir)
        self.rng_state = rng_state
        self.lock = asyncio.Lock()
        self.results: dict[int, dict[str, Any]] = {}
        """Metrics row of each applied step still on record (a retried step id is answered from here)."""
        self._sampled = [0, 0]
        """[prompt, completion] tokens sampled since the last step, for its usage line."""

    @property
    def adapter_id(self) -> str:
        """The id the app's sampler routes this model's requests by (`training_service.table`)."""
        return f"trainable/{self.tenant}/{self.name}"

    @property
    def step(self) -> int:
        return self.policy.adapters.version

    # ---- building ----------------------------------------------------------------------------
    @classmethod
    def build(cls, tenant: str, name: str, config: RunConfig, base, run_dir: Path) -> HostedModel:
        """The model as the trainer would start it from `config.seed`, before any checkpoint."""
        with base.lock, _isolated_rngs(config.model.device):
            seed_everything(config.seed)
            policy = policy_for(config.model, config.lora, seed=config.seed, served_name=name, base=base)
            params = [p for p in policy.model.parameters() if p.requires_grad]
            o = config.optim
            optimizer = adamw(params, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
            rng_state = torch.get_rng_state()
        if (
            o.micro_batch_tokens is None
        ):  # as the trainer: once, from the free memory once the model has loaded
            tokens = auto_micro_batch_tokens(
                policy.model, str(policy.model.device), checkpointing=o.gradient_checkpointing
            )
            config = config.model_copy(update={"optim": o.model_copy(update={"micro_batch_tokens": tokens})})
        return cls(tenant, name, config, policy, optimizer, run_dir, rng_state=rng_state)

    @classmethod
    def create(cls, tenant: str, name: str, config: RunConfig, base, run_dir: Path) -> HostedModel:
        """A new model: built, its settings and step-0 checkpoint written to `run_dir` (which must not exist)."""
        model = cls.build(tenant, name, config, base, run_dir)
        (run_dir / "config.toml").write_text(dump_config(model.config))  # micro_batch_tokens resolved: kept
        meta = {"tenant": tenant, "name": name, "created": time.time()}
        (run_dir / SERVICE_FILE).write_text(json.dumps(meta, indent=1))
        model._checkpoint()
        return model

    @classmethod
    def restore(cls, run_dir: Path, base, warn=None) -> HostedModel:
        """A model the service held before it stopped, at its last intact checkpoint."""
        meta = json.loads((run_dir / SERVICE_FILE).read_text())
        config = load_config(run_dir / "config.toml", {"output_dir": str(run_dir)})
        model = cls.build(meta["tenant"], meta["name"], config, base, run_dir)
        checkpoint = latest_checkpoint(run_dir, warn=warn)
        if checkpoint is not None:  # one that fails to load: the one before it, named to `warn`
            load_with_fallback(checkpoint, model._load, warn)
        else:  # stopped before its step-0 checkpoint was complete: the start again, from the seed
            model._checkpoint()
        return model

    @property
    def max_staleness(self) -> int:
        """How many versions behind the live adapter a submitted turn may be: the model's
        `rollout.max_staleness`, the bound `grooves train` holds its steps to."""
        return self.config.rollout.max_staleness

    @property
    def longest_sequence(self) -> int:
        """The most tokens one training sequence may hold: the widest row one micro-batch of
        `optim.micro_batch_tokens` holds, attention's T x T memory counted (`training.memory`)."""
        o = self.config.optim
        pairs = pair_tokens(self.policy.model, checkpointing=o.gradient_checkpointing)
        return longest_row(o.micro_batch_tokens, pairs)

    # ---- training ----------------------------------------------------------------------------
    def train(self, groups: list[TrajectoryGroup], digest: str) -> tuple[dict[str, Any], int]:
        """One step on checked groups (blocking): the trainer's `train_step`, then the run folder.
        Returns the step's metrics row and its trained tokens.

        The groups' statistics are computed before the weights change, so a step whose numbers
        cannot be computed is not applied; the row holds null where a number is not finite (as
        metrics.jsonl does), so every applied step can be recorded and answered."""
        t0 = time.perf_counter()
        scored = {
            "groups_with_signal": float(groups_with_signal([g for g in groups if len(g.ok) >= 2])),
            **reward_stats(groups),
        }
        with self.policy.lock, self._rngs():
            stats, seqs = train_step(
                self.policy, self.optimizer, groups, self.config, self.loss, history=self.history
            )
        step = self.step
        row = finite_or_null(
            {
                "step": step,
                **scored,
                **stats,
                "lr": self.config.optim.lr,
                "micro_batch_tokens": self.config.optim.micro_batch_tokens,
                "adapter_version": step,
                "seconds_train": time.perf_counter() - t0,
                "request_sha256": digest,
            }
        )
        self.results[step] = row  # a retry is answered with this row, whatever below fails
        usage = {
            "step": step,
            "tenant": self.tenant,
            "prompt_tokens": self._sampled[0],
            "sampled_tokens": self._sampled[1],
            "trained_tokens": sum(len(s) for s in seqs),
        }
        self._sampled = [0, 0]
        self.log.log(row)
        with (self.run_dir / USAGE_FILE).open("a") as f:
            f.write(json.dumps(usage) + "\n")
        if step % self.config.logging.samples_every == 0:
            self._decode(groups)
            self.log.samples(step, groups)
        if step % self.config.checkpoint.every == 0:
            self._checkpoint()
        self.log.plot()
        return row, usage["trained_tokens"]

    def note_sampled(self, prompt_tokens: int, completion_tokens: int) -> None:
        """A chat completion of this model was answered: counted in the next step's usage line."""
        self._sampled[0] += prompt_tokens
        self._sampled[1] += completion_tokens

    def _decode(self, groups: list[TrajectoryGroup]) -> None:
        """The sampled text of each turn, for the samples a person reads (only token ids were sent)."""
        tokenizer = self.policy.tokenizer
        for g in groups:
            for traj in g.ok:
                for turn in traj.turns:
                    turn.text = tokenizer.decode(turn.token_ids, skip_special_tokens=True)

    # ---- checkpoints -------------------------------------------------------------------------
    def checkpoints(self) -> list[int]:
        """Steps of the kept, finished checkpoints, oldest first."""
        folder = self.run_dir / "checkpoints"
        if not folder.is_dir():
            return []
        return sorted(
            int(p.name.removeprefix(CHECKPOINT_PREFIX))
            for p in folder.iterdir()
            if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) and not p.name.endswith(".tmp")
        )

    def select(self, step: int) -> None:
        """Back to checkpoint `step`: weights, optimizer, RNG and step count as they were then; the
        checkpoints, metrics and usage lines after it are deleted, so a restart comes back here too."""
        path = checkpoint_dir(self.run_dir, step)
        problem = checkpoint_problem(path) if path.is_dir() else "it does not exist"
        if problem is not None:
            raise LookupError(f"checkpoint {step} of model {self.name!r} cannot be selected: {problem}")
        self._load(path)
        for later in self.checkpoints():
            if later > step:
                shutil.rmtree(checkpoint_dir(self.run_dir, later))
        for tmp in (self.run_dir / "checkpoints").glob("*.tmp"):
            shutil.rmtree(tmp, ignore_errors=True)
        if self.log.metrics_path.exists():
            self.log.plot()

    def _checkpoint(self) -> Path:
        state = TrainState(step=self.step, data_position=self.step)
        with self.policy.lock, self._rngs():
            return save_checkpoint(
                self.run_dir,
                state,
                self.policy.model,
                self.optimizer,
                self.policy.generator,
                dump_config(self.config),
                self.config.checkpoint.keep,
            )

    def _load(self, checkpoint: Path) -> None:
        """Weights, optimizer and RNG states from `checkpoint`; the run folder's records cut back to it."""
        with self.policy.lock, self._rngs():
            state = load_checkpoint(checkpoint, self.policy.model, self.optimizer, self.policy.generator)
        self.policy.adapters.version = state.step
        self.log.truncate_after(state.step)
        usage = self.run_dir / USAGE_FILE
        if usage.exists():
            write_jsonl(usage, [r for r in read_jsonl(usage) if r.get("step", 0) <= state.step])
        self.results = {r["step"]: r for r in self.log.rows() if "loss" in r}

    def usage_rows(self) -> list[dict[str, Any]]:
        path = self.run_dir / USAGE_FILE
        return read_jsonl(path) if path.exists() else []

    @contextlib.contextmanager
    def _rngs(self) -> Iterator[None]:
        """Inside: torch's RNG is this model's stream (saved back on the way out); the process's
        own torch, Python and numpy states are as they were afterwards."""
        with _isolated_rngs(self.config.model.device):
            torch.set_rng_state(self.rng_state)
            yield
            self.rng_state = torch.get_rng_state()


def finite_or_null(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with None for each float that is inf or NaN (JSON has neither; metrics.jsonl writes null)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


@contextlib.contextmanager
def _isolated_rngs(device: str) -> Iterator[None]:
    """Torch's (CPU and the model's accelerator), Python's and numpy's RNG states restored on exit."""
    accelerator = torch.device(device)
    devices = [accelerator.index or 0] if accelerator.type == "cuda" else []
    python, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy_state)
