"""The adapters a run produced: its step checkpoints, and the best one by a validation metric.

A run folder already holds everything needed: `checkpoints/step_NNNNNN/adapter` (peft format) and
`metrics.jsonl` (one row per step, validation rows carrying `val/...` keys). The registry only reads
them, so it works the same for RL runs (`grooves train`), SFT runs (`grooves sft`) and runs still in
progress. "Best" is chosen among checkpoints that still exist and whose step has the metric:
pruning keeps the newest `checkpoint.keep` and the best by `checkpoint.keep_best_by`
(`val/success_rate` unless set otherwise), so best by another metric may have been pruned.

`resolve_adapter` turns what a user types (an adapter folder, a checkpoint folder, or a run folder
with `latest` / `best` / a step) into one adapter folder; every adapter command goes through it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

DEFAULT_METRIC = "val/success_rate"


class AdapterNotFound(FileNotFoundError):
    """A path or selection that names no adapter; the message says what was there and what to pass."""


class BadAdapter(ValueError):
    """An adapter whose weights must not be used: some hold NaN or inf (a run that diverged)."""


@dataclass(frozen=True)
class CheckpointEntry:
    step: int
    path: Path
    """The checkpoint folder (`checkpoints/step_NNNNNN`)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """The metrics.jsonl row of this step (empty if the step has none)."""

    @property
    def adapter(self) -> Path:
        return self.path / "adapter"


def is_adapter_dir(path: Path) -> bool:
    return (path / "adapter_config.json").is_file()


def check_adapter_finite(adapter_dir: str | Path) -> None:
    """Raise `BadAdapter` if any weight of the adapter is NaN or inf.

    Such an adapter turns every logit it touches into NaN; served, it answers garbage, merged, it
    poisons the exported model. Export and the adapter server refuse it. Reads the weights only
    (safetensors, or a `.bin` with `torch.load(weights_only=True)`), never runs code.
    """
    import pickle

    import torch
    from safetensors import SafetensorError, safe_open

    adapter_dir = Path(adapter_dir)
    tensors: list[tuple[str, torch.Tensor]] = []
    try:
        for file in sorted(adapter_dir.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                tensors += [(k, f.get_tensor(k)) for k in f.keys()]  # noqa: SIM118 (safe_open is no dict)
        if not tensors:
            for file in sorted(adapter_dir.glob("adapter_model*.bin")):
                tensors += list(torch.load(file, weights_only=True, map_location="cpu").items())
    except (SafetensorError, pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        raise BadAdapter(f"{adapter_dir}: its weights cannot be read ({exc})") from exc
    bad = [name for name, t in tensors if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise BadAdapter(
            f"{adapter_dir}: {len(bad)} of {len(tensors)} weight tensors hold NaN or inf (first: {bad[0]}); "
            "the run diverged before this checkpoint: pick an earlier one"
        )


class AdapterRegistry:
    """Read-only view of one run folder's checkpoints and metrics."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise AdapterNotFound(f"{self.run_dir}: no such run folder")

    def _metric_rows(self) -> dict[int, dict[str, Any]]:
        path = self.run_dir / "metrics.jsonl"
        rows: dict[int, dict[str, Any]] = {}
        if not path.exists():
            return rows
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows.setdefault(int(row.get("step", 0)), {}).update(row)
        return rows

    def checkpoints(self) -> list[CheckpointEntry]:
        """Complete checkpoints (those with a state.json and an adapter), oldest first."""
        # imported here: grooves.training.checkpoint loads torch, and `grooves judge` must start without it
        from grooves.training.checkpoint import CHECKPOINT_PREFIX

        folder = self.run_dir / "checkpoints"
        if not folder.is_dir():
            return []
        rows = self._metric_rows()
        out = []
        for p in sorted(folder.iterdir()):
            if not p.name.startswith(CHECKPOINT_PREFIX) or p.name.endswith(".tmp"):
                continue
            if not (p / "state.json").exists() or not is_adapter_dir(p / "adapter"):
                continue
            step = int(json.loads((p / "state.json").read_text())["step"])
            out.append(CheckpointEntry(step, p, rows.get(step, {})))
        return out

    def latest(self) -> CheckpointEntry:
        entries = self.checkpoints()
        if not entries:
            raise AdapterNotFound(f"{self.run_dir}: no complete checkpoint under checkpoints/ yet")
        return entries[-1]

    def step(self, step: int) -> CheckpointEntry:
        entries = self.checkpoints()
        for e in entries:
            if e.step == step:
                return e
        raise AdapterNotFound(
            f"{self.run_dir}: no checkpoint of step {step}; kept steps: {[e.step for e in entries]}"
        )

    def best(self, metric: str = DEFAULT_METRIC, mode: Literal["max", "min"] = "max") -> CheckpointEntry:
        """The checkpoint whose step scored best on `metric`; ties go to the later step."""
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        scored = [e for e in self.checkpoints() if _finite(e.metrics.get(metric))]
        if not scored:
            seen = sorted({k for e in self.checkpoints() for k in e.metrics if k.startswith("val/")})
            raise AdapterNotFound(
                f"{self.run_dir}: no kept checkpoint has {metric!r} in metrics.jsonl "
                f"(validation metrics at kept checkpoints: {seen or 'none'}); validate on checkpoint steps "
                "or set checkpoint.keep_best_by to this metric"
            )
        sign = 1.0 if mode == "max" else -1.0
        return max(scored, key=lambda e: (sign * float(e.metrics[metric]), e.step))


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


Selection = str
"""`latest`, `best`, or a step number (as text), applied when the source is a run folder."""


def resolve_adapter(
    source: str | Path,
    select: Selection = "latest",
    metric: str = DEFAULT_METRIC,
    mode: Literal["max", "min"] = "max",
) -> Path:
    """The adapter folder that `source` names.

    - an adapter folder (has `adapter_config.json`) -> itself;
    - a checkpoint folder (has `adapter/`) -> its adapter;
    - a run folder (has `checkpoints/`) -> the checkpoint chosen by `select`.
    """
    path = Path(source)
    if is_adapter_dir(path):
        return path
    if is_adapter_dir(path / "adapter"):
        return path / "adapter"
    if (path / "checkpoints").is_dir():
        registry = AdapterRegistry(path)
        if select == "latest":
            return registry.latest().adapter
        if select == "best":
            return registry.best(metric, mode).adapter
        if select.isdigit():
            return registry.step(int(select)).adapter
        raise ValueError(f"select={select!r}: use 'latest', 'best' or a step number")
    if not path.exists():
        raise AdapterNotFound(f"{path}: no such folder")
    raise AdapterNotFound(
        f"{path}: not an adapter (no adapter_config.json), a checkpoint (no adapter/) or a run folder "
        "(no checkpoints/); pass one of those"
    )
