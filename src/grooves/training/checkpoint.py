"""Checkpoints: everything needed to continue a run as if it had never stopped.

A checkpoint is a folder `checkpoints/step_000012/` holding the adapter (peft format, loadable by
`grooves serve --adapter`, with `base_model.json`: the base's Hub id, path and weights sha256,
checked again on resume), the optimizer state, every RNG state, the data position and the
resolved config. It is written to a temporary folder and renamed into place, so a run killed
mid-write leaves the previous checkpoint intact, never a half-written one. A write that fails
removes its temporary folder; when the disk is full, that is one line (a CheckpointError) naming
the checkpoint, the space it needs and the space free.

What can still go wrong is the disk: a file truncated or changed after it was written (a full
disk, a copy cut short, a bad sector). So the last file written is `manifest.json`, the size and
sha256 of every other file, and a checkpoint is used only if every file in it is listed there and
matches. Resuming takes the newest intact checkpoint; each newer one that fails the check is named
on one line with what is wrong, and skipped. A checkpoint that passes but still cannot be loaded
(one of the older format below, which has no manifest) is named the same way, and the one before
it is loaded instead (`load_with_fallback`).

Retention keeps the newest `keep` checkpoints and, besides them, the best one by a validation
metric (`checkpoint.keep_best_by`, read from the run's metrics.jsonl), so pruning never deletes the
checkpoint `--select best` would pick (ART keeps its best and latest the same way).

Loading never runs code from the checkpoint: `optimizer.pt` and `rng.pt` hold only tensors,
numbers and lists (the RNG states are stored as tensors, not as pickled Python and numpy
objects) and are read with `torch.load(weights_only=True)`. Checkpoints written before this
format (state.json without `format`, no manifest) still load: their `rng.pt` holds a numpy
array, which is read with only numpy's array reconstruction allowed besides tensors, and they
are used unverified because they carry no checksums.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from grooves.config.checkpoint import CheckpointConfig
from grooves.jsonl import read_jsonl
from grooves.models import check_adapter_base, describe_base, file_sha256, record_adapter_base

CHECKPOINT_PREFIX = "step_"
FORMAT = 2
"""`format` in state.json: 2 = RNG states as tensors, manifest.json with checksums; absent = older."""
MANIFEST = "manifest.json"
T = TypeVar("T")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names it and says what is wrong."""


@dataclass
class TrainState:
    step: int
    """Number of optimizer steps completed."""
    data_position: int
    """How many training scenarios have been consumed (across epochs)."""


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"{CHECKPOINT_PREFIX}{step:06d}"


def save_checkpoint(
    run_dir: Path,
    state: TrainState,
    model,
    optimizer,
    policy_generator,
    config_toml: str,
    keep: int,
    extra: dict[str, Path] | None = None,
    *,
    keep_best_by: str = "",
    keep_best_mode: str = "max",
) -> Path:
    """Write checkpoint `state.step` (see the module docstring), then prune: the newest `keep`
    stay, and the best by `keep_best_by` (a metrics.jsonl key, e.g. `val/success_rate`; "" keeps
    no best) stays too. `extra` copies more folders into it, {path in the checkpoint: folder},
    checksummed like the rest (the saved adapter versions of `training.pipeline`)."""
    final = checkpoint_dir(run_dir, state.step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(tmp, state, model, optimizer, policy_generator, config_toml, extra)
    except Exception as exc:  # nothing half-written stays (a resume never picks a .tmp folder anyway)
        shutil.rmtree(tmp, ignore_errors=True)
        needed = _bytes_needed(final.parent, model, optimizer, policy_generator, extra)
        free = shutil.disk_usage(next(p for p in final.parents if p.exists())).free
        if not _disk_full(exc, free, needed):
            raise
        raise CheckpointError(
            f"cannot write checkpoint {final}: the disk is full (it needs about {_size(needed)}, "
            f"{_size(free)} are free); free some space, then continue with --resume"
        ) from None
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    _prune(run_dir / "checkpoints", keep, _step_scores(run_dir, keep_best_by), keep_best_mode)
    return final


def save_if_due(
    run_dir: Path,
    state: TrainState,
    policy,
    optimizer,
    config_toml: str,
    settings: CheckpointConfig,
    *,
    last: int,
    force: bool = False,
    extra: dict[str, Path] | None = None,
) -> Path | None:
    """A run's checkpoint of `state.step`, when the run's `[checkpoint]` (`settings`) says one is
    due: every `settings.every` steps, after the `last` step, and whenever `force`d (a run the
    watch pauses); kept and pruned as `settings` says. RL (`training.loop`) and SFT
    (`training.sft`) save through this. The policy's lock is held while it is written, so no
    adapter is loaded or unloaded beside it. None when none was due."""
    if not (force or state.step == last or state.step % settings.every == 0):
        return None
    with policy.lock:
        return save_checkpoint(
            run_dir,
            state,
            policy.model,
            optimizer,
            policy.generator,
            config_toml,
            settings.keep,
            extra,
            keep_best_by=settings.keep_best_by,
            keep_best_mode=settings.keep_best_mode,
        )


def _write(tmp: Path, state: TrainState, model, optimizer, policy_generator, config_toml: str, extra) -> None:
    tmp.mkdir(parents=True)
    # the training adapter only: adapters served beside it (pinned versions, extra names) are not the run's
    model.save_pretrained(tmp / "adapter", selected_adapters=["default"])
    base = _base_path(model)
    if base is not None:  # the base by Hub id, path and weights hash (hashed once, then cached)
        record_adapter_base(tmp / "adapter", describe_base(base))
    for name, folder in (extra or {}).items():
        shutil.copytree(folder, tmp / name)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(rng_states(policy_generator), tmp / "rng.pt")
    (tmp / "state.json").write_text(
        json.dumps({"step": state.step, "data_position": state.data_position, "format": FORMAT})
    )
    (tmp / "config.toml").write_text(config_toml)
    _write_manifest(tmp)  # last: a checkpoint whose manifest is missing was never finished


def _disk_full(exc: Exception, free: int, needed: int) -> bool:
    """Whether a failed write ran out of disk. Each writer says so its own way: Python's file
    writes raise OSError(ENOSPC), safetensors' own writer an error quoting "os error 28", and
    torch.save a RuntimeError about the zip file's position; so, besides those words, a failed
    write with less room free than the checkpoint needs counts as a full disk too."""
    if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    return "os error 28" in text or "No space left on device" in text or free < needed


def _bytes_needed(folder: Path, model, optimizer, policy_generator, extra: dict[str, Path] | None) -> int:
    """About how many bytes the checkpoint takes: as much as the newest one in `folder` did, or, for
    the first, its tensors and copied folders and 32 KiB for the small files beside them."""
    older = _checkpoints(folder) if folder.is_dir() else []
    if older:
        return sum(p.stat().st_size for p in older[0].rglob("*") if p.is_file())

    def tensor_bytes(values) -> int:
        return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))

    from peft import get_peft_model_state_dict

    adapter = tensor_bytes(get_peft_model_state_dict(model, adapter_name="default").values())
    moments = sum(tensor_bytes(state.values()) for state in optimizer.state.values())
    rng = tensor_bytes(rng_states(policy_generator).values())
    copied = sum(
        p.stat().st_size for folder in (extra or {}).values() for p in Path(folder).rglob("*") if p.is_file()
    )
    return adapter + moments + rng + copied + 32 * 1024


def _size(n: float) -> str:
    """A byte count for people.

    >>> _size(512), _size(3 * 2**20 + 1), _size(5 * 2**40)
    ('512 bytes', '3.0 MiB', '5.0 TiB')
    """
    if n < 1024:
        return f"{int(n)} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"


def _base_path(model) -> str | None:
    """The folder or hub id the peft model's base was loaded from (peft records it per adapter)."""
    config = getattr(model, "peft_config", {}).get("default")
    return getattr(config, "base_model_name_or_path", None) or None


def seed_everything(seed: int) -> None:
    """Seed the RNGs a run draws from besides the policy's own generator: Python's, numpy's, torch's."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_states(policy_generator) -> dict[str, torch.Tensor]:
    """Every RNG state the run draws from, as tensors (loadable with `weights_only=True`)."""
    version, mt, gauss = random.getstate()  # (3, 625 ints below 2**32, None or a float)
    kind, keys, pos, has_gauss, cached = np.random.get_state()  # ("MT19937", uint32[624], ...)
    return {
        "torch": torch.get_rng_state(),
        "policy": policy_generator.get_state(),
        "python": torch.tensor([version, *mt], dtype=torch.int64),
        "python_gauss": torch.tensor([] if gauss is None else [gauss], dtype=torch.float64),
        "numpy": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "numpy_pos": torch.tensor([pos, has_gauss], dtype=torch.int64),
        "numpy_gauss": torch.tensor([cached], dtype=torch.float64),
    }


def set_rng_states(states: dict, policy_generator) -> None:
    torch.set_rng_state(states["torch"])
    policy_generator.set_state(states["policy"])
    if isinstance(states["python"], tuple):  # the older format kept Python's and numpy's own objects
        random.setstate(states["python"])
        np.random.set_state(states["numpy"])
        return
    python = states["python"].tolist()
    gauss = states["python_gauss"].tolist()
    random.setstate((python[0], tuple(python[1:]), gauss[0] if gauss else None))
    pos, has_gauss = states["numpy_pos"].tolist()
    np.random.set_state(
        (
            "MT19937",
            states["numpy"].numpy().astype(np.uint32),
            pos,
            has_gauss,
            float(states["numpy_gauss"][0]),
        )
    )


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def _write_manifest(folder: Path) -> None:
    files = {
        p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        for p in _files(folder)
    }
    (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, "files": files}, indent=1))


def checkpoint_problem(path: Path) -> str | None:
    """What is wrong with the checkpoint at `path` (a short phrase), or None if it is intact."""
    try:
        state = json.loads((path / "state.json").read_text())
    except FileNotFoundError:
        return "state.json is missing"
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "state.json is not JSON"
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return (
            "manifest.json is missing" if state.get("format") else None
        )  # older checkpoints carry no checksums
    try:
        files = json.loads(manifest_path.read_text())["files"]
        listed = {name: (int(e["bytes"]), str(e["sha256"])) for name, e in files.items()}
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return "manifest.json is not readable"
    for name, (size_listed, sha_listed) in listed.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        size = file.stat().st_size
        if size != size_listed:
            return f"{name} has {size} bytes, the manifest says {size_listed}"
        if file_sha256(file) != sha_listed:
            return f"{name} does not match its sha256 in the manifest"
    # a file the manifest leaves out was never checked: it may be the damaged one
    unlisted = [
        p.relative_to(path).as_posix() for p in _files(path) if p.relative_to(path).as_posix() not in listed
    ]
    if unlisted:
        more = f" and {len(unlisted) - 1} more" if len(unlisted) > 1 else ""
        return f"{unlisted[0]}{more} not listed in manifest.json"
    return None


def retained_steps(
    steps: list[int], keep: int, scores: dict[int, float] | None = None, mode: str = "max"
) -> set[int]:
    """The checkpoint steps to keep: the newest `keep`, plus the step whose score is best.

    `scores` maps a step to its metric (steps without one are never "best"); `mode` says whether
    higher (`max`) or lower (`min`) is better; ties go to the later step, as `--select best` picks.

    >>> sorted(retained_steps([1, 2, 3, 4, 5], keep=2, scores={2: 0.9, 4: 0.5, 5: 0.7}))
    [2, 4, 5]
    >>> sorted(retained_steps([1, 2, 3], keep=1, scores={1: 0.3, 2: 0.1}, mode="min"))
    [2, 3]
    """
    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    ordered = sorted(steps)
    kept = set(ordered[-keep:]) if keep > 0 else set()
    scored = [s for s in ordered if s in (scores or {})]
    if scored:
        sign = 1.0 if mode == "max" else -1.0
        kept.add(max(scored, key=lambda s: (sign * scores[s], s)))  # type: ignore[index]
    return kept


def _step_scores(run_dir: Path, metric: str) -> dict[int, float]:
    """`metric` per step from the run's metrics.jsonl (finite numbers only); {} without a metric."""
    path = run_dir / "metrics.jsonl"
    if not metric or not path.is_file():
        return {}
    scores: dict[int, float] = {}
    for row in read_jsonl(path):
        value = row.get(metric)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            scores[int(row.get("step", 0))] = float(value)
    return scores


def _prune(folder: Path, keep: int, scores: dict[int, float] | None = None, mode: str = "max") -> None:
    done = {
        int(p.name.removeprefix(CHECKPOINT_PREFIX)): p
        for p in folder.iterdir()
        if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) and not p.name.endswith(".tmp")
    }
    kept = retained_steps(list(done), keep, scores, mode)
    for step, path in sorted(done.items()):
        if step not in kept:
            shutil.rmtree(path)


def _checkpoints(folder: Path) -> list[Path]:
    """The finished checkpoint folders in `folder`, newest first."""
    return sorted(
        (
            p
            for p in folder.iterdir()
            if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) and not p.name.endswith(".tmp")
        ),
        reverse=True,
    )


def latest_checkpoint(run_dir: Path, warn=None) -> Path | None:
    """The newest intact checkpoint of a run, or None. Each newer one that fails `checkpoint_problem`
    is skipped and reported to `warn` (one line naming it, what is wrong and what is used instead)."""
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        return None
    found = _checkpoints(folder)
    skipped: list[tuple[Path, str]] = []
    for path in found:
        problem = checkpoint_problem(path)
        if problem is None:
            for bad, why in skipped:
                if warn is not None:
                    warn(f"checkpoint {bad} is damaged ({why}); falling back to {path.name}")
            return path
        skipped.append((path, problem))
    if skipped:
        details = "; ".join(f"{p.name}: {why}" for p, why in skipped)
        raise CheckpointError(f"no intact checkpoint in {folder} ({details}); start again with --overwrite")
    return None


def load_with_fallback(first: Path, load: Callable[[Path], T], warn=None) -> tuple[Path, T]:
    """`load(first)`; when that raises CheckpointError, the next older intact checkpoint beside it,
    and so on. Each one that cannot be loaded is reported to `warn` on one line naming it, why, and
    what is used instead; when none loads, one CheckpointError names them all. `load` must set
    everything it touches (as `load_checkpoint` does), so a failed attempt leaves nothing behind."""
    older = [p for p in _checkpoints(first.parent) if p.name < first.name]
    failed: list[str] = []
    for path in [first, *older]:
        problem = checkpoint_problem(path) if path is not first else None
        if problem is not None:
            failed.append(f"checkpoint {path} is damaged ({problem})")
            continue
        try:
            loaded = load(path)
        except CheckpointError as exc:
            failed.append(str(exc))
            continue
        for why in failed:
            if warn is not None:
                warn(f"{why}; falling back to {path.name}")
        return path, loaded
    raise CheckpointError(
        f"no checkpoint in {first.parent} can be loaded: {'; '.join(failed)}; start again with --overwrite"
    )


def load_checkpoint(path: Path, model, optimizer, policy_generator) -> TrainState:
    """Set the adapter, optimizer and RNG states from the checkpoint at `path`. A file that cannot
    be read (damage no manifest covered, as in checkpoints of the older format) is a one-line
    CheckpointError naming it."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    base = _base_path(model)
    if base is not None:
        check_adapter_base(path / "adapter", base)  # logs a warning if the base's weights changed
    with _reading(path, "adapter/adapter_model.safetensors"):
        adapter = load_file(str(path / "adapter" / "adapter_model.safetensors"))
    try:
        result = set_peft_model_state_dict(model, adapter, adapter_name="default")
    except RuntimeError as exc:  # shapes differ: another lora.rank or base model
        detail = next(
            (line.strip() for line in str(exc).splitlines() if "size mismatch" in line),
            str(exc).splitlines()[0],
        )
        raise CheckpointError(
            f"{path}: the adapter does not fit this run (lora.rank or model.base_model changed?): {detail}"
        ) from None
    # only the trained adapter ("default") is saved; another one loaded beside it (the KL
    # penalty's frozen reference) is missing from every checkpoint by design
    missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k and ".default." in k]
    unexpected = list(getattr(result, "unexpected_keys", []))
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: the adapter's layers are not this run's (lora.target_modules or model.base_model changed?): "
            f"{len(missing)} missing, {len(unexpected)} unexpected, e.g. {(missing + unexpected)[0]}"
        )
    with _reading(path, "optimizer.pt"):
        saved = _load_tensors(path / "optimizer.pt")
    try:
        optimizer.load_state_dict(saved)
    except ValueError as exc:
        raise CheckpointError(f"{path}: optimizer.pt does not fit this run's adapter: {exc}") from None
    with _reading(path, "state.json"):
        info = json.loads((path / "state.json").read_text())
        state = TrainState(step=int(info["step"]), data_position=int(info["data_position"]))
    with _reading(path, "rng.pt"):
        set_rng_states(_load_tensors(path / "rng.pt", legacy_numpy=not info.get("format")), policy_generator)
    return state


@contextlib.contextmanager
def _reading(path: Path, name: str):
    """Turn a failure to read or use the checkpoint's file `name` into a one-line CheckpointError."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, ValueError, KeyError, TypeError, IndexError, SafetensorError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CheckpointError(f"{path}: {name} cannot be read ({type(exc).__name__}: {first})") from None


def _load_tensors(file: Path, legacy_numpy: bool = False):
    """`torch.load(weights_only=True)`: tensors, numbers, strings and containers only, never code.
    `legacy_numpy` also admits numpy arrays (rebuilt from their bytes), which older checkpoints hold."""
    import pickle

    allowed: list[Any] = (
        [np.empty(0).__reduce__()[0], np.ndarray, np.dtype, type(np.dtype(np.uint32))] if legacy_numpy else []
    )
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(file, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{file}: cannot be loaded safely ({first})") from None
