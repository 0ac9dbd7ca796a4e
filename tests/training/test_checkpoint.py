"""Checkpoints: RNG states survive a save and load, nothing in them runs as code, damage is found."""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from grooves.training.checkpoint import (
    CheckpointError,
    TrainState,
    checkpoint_problem,
    latest_checkpoint,
    load_checkpoint,
    load_with_fallback,
    save_checkpoint,
)


@pytest.fixture
def trainee(tiny_model_dir):
    """A LoRA model on the tiny base with an AdamW state after one step, and a sampling generator."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=2, target_modules=["q_proj"])
    )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    return model, optimizer, torch.Generator().manual_seed(5)


def _draws(generator) -> list[float]:
    return [
        random.random(),
        random.gauss(0, 1),
        float(np.random.rand()),
        float(np.random.randn()),
        float(torch.rand(1)),
        float(torch.rand(1, generator=generator)),
    ]


def test_a_checkpoint_restores_every_rng_and_loads_with_weights_only(trainee, tmp_path):
    model, optimizer, generator = trainee
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    random.gauss(0, 1), np.random.randn()  # leave a cached Gaussian in both, which the state must carry
    path = save_checkpoint(
        tmp_path, TrainState(step=7, data_position=28), model, optimizer, generator, "name = 'x'\n", keep=3
    )
    expected = _draws(generator)
    for name in ("rng.pt", "optimizer.pt"):  # plain tensors and containers: no code to run
        torch.load(path / name, weights_only=True)

    optimizer.state.clear()
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    state = load_checkpoint(path, model, optimizer, generator)
    assert (state.step, state.data_position) == (7, 28)
    assert _draws(generator) == expected
    assert len(optimizer.state) == len(optimizer.param_groups[0]["params"])


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {_Payload.marker}",))


def test_a_checkpoint_file_that_would_run_code_is_refused_and_the_code_does_not_run(trainee, tmp_path):
    model, optimizer, generator = trainee
    path = save_checkpoint(
        tmp_path, TrainState(step=1, data_position=4), model, optimizer, generator, "", keep=3
    )
    _Payload.marker = tmp_path / "ran"
    with (path / "optimizer.pt").open("wb") as f:
        pickle.dump({"state": {}, "param_groups": [], "x": _Payload()}, f)
    with pytest.raises(CheckpointError, match=r"optimizer.pt: cannot be loaded safely"):
        load_checkpoint(path, model, optimizer, generator)
    assert not _Payload.marker.exists()


def test_a_checkpoint_of_the_older_format_still_loads(trainee, tmp_path):
    """Before checksums: rng.pt held Python's and numpy's own state objects, state.json had no format."""
    model, optimizer, generator = trainee
    path = save_checkpoint(
        tmp_path, TrainState(step=2, data_position=8), model, optimizer, generator, "", keep=3
    )
    random.seed(4), np.random.seed(4), torch.manual_seed(4)
    old = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "policy": generator.get_state(),
    }
    torch.save(old, path / "rng.pt")
    (path / "state.json").write_text(json.dumps({"step": 2, "data_position": 8}))
    (path / "manifest.json").unlink()
    expected = _draws(generator)
    assert checkpoint_problem(path) is None  # no checksums to check
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    load_checkpoint(path, model, optimizer, generator)
    assert _draws(generator) == expected


def _three(trainee, run_dir):
    model, optimizer, generator = trainee
    return [
        save_checkpoint(
            run_dir, TrainState(step=s, data_position=4 * s), model, optimizer, generator, "", keep=5
        )
        for s in (1, 2, 3)
    ]


def test_a_damaged_latest_checkpoint_is_named_and_the_previous_one_used(trainee, tmp_path):
    one, two, three = _three(trainee, tmp_path)
    said: list[str] = []
    assert latest_checkpoint(tmp_path, warn=said.append) == three and said == []

    adapter = three / "adapter" / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:-100])  # cut short
    assert latest_checkpoint(tmp_path, warn=said.append) == two
    assert said == [
        f"checkpoint {three} is damaged (adapter/adapter_model.safetensors has {adapter.stat().st_size} bytes, "
        f"the manifest says {adapter.stat().st_size + 100}); falling back to step_000002"
    ]

    optim = two / "optimizer.pt"
    data = bytearray(optim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte changed
    optim.write_bytes(bytes(data))
    said.clear()
    assert latest_checkpoint(tmp_path, warn=said.append) == one
    assert (
        len(said) == 2
        and "optimizer.pt does not match its sha256" in said[1]
        and said[1].startswith(f"checkpoint {two} ")
    )

    (one / "manifest.json").unlink()  # a checkpoint of this format without its manifest was never finished
    with pytest.raises(CheckpointError) as info:
        latest_checkpoint(tmp_path)
    message = str(info.value)
    assert (
        "step_000001: manifest.json is missing" in message
        and "step_000003: adapter" in message
        and "\n" not in message
    )


def test_a_damaged_file_the_manifest_leaves_out_is_found_and_the_previous_checkpoint_used(trainee, tmp_path):
    one, two, three = _three(trainee, tmp_path)
    manifest = json.loads((three / "manifest.json").read_text())
    del manifest["files"]["adapter/adapter_model.safetensors"]  # listed nowhere, so never checked...
    (three / "manifest.json").write_text(json.dumps(manifest))
    (three / "adapter" / "adapter_model.safetensors").write_bytes(b"\x00" * 64)  # ...and damaged
    said: list[str] = []
    assert latest_checkpoint(tmp_path, warn=said.append) == two
    assert said == [
        f"checkpoint {three} is damaged (adapter/adapter_model.safetensors not listed in manifest.json); "
        "falling back to step_000002"
    ]
    (two / "stray.bin").write_bytes(b"x")
    (two / "adapter" / "stray.txt").write_text("x")
    assert checkpoint_problem(two) == "adapter/stray.txt and 1 more not listed in manifest.json"


def test_a_checkpoint_that_fails_to_load_falls_back_to_the_one_before(trainee, tmp_path):
    """Checkpoints of the older format carry no manifest, so only loading finds their damage."""
    model, optimizer, generator = trainee
    one, two, three = _three(trainee, tmp_path)
    for path in (one, two, three):
        state = json.loads((path / "state.json").read_text())
        (path / "state.json").write_text(json.dumps({k: v for k, v in state.items() if k != "format"}))
        (path / "manifest.json").unlink()
    (three / "adapter" / "adapter_model.safetensors").write_bytes(b"\x00" * 64)

    def load(path):
        return load_checkpoint(path, model, optimizer, generator)

    said: list[str] = []
    assert latest_checkpoint(tmp_path) == three  # nothing to check it against
    path, state = load_with_fallback(three, load, said.append)
    assert path == two and (state.step, state.data_position) == (2, 8)
    assert len(said) == 1 and said[0].startswith(
        f"{three}: adapter/adapter_model.safetensors cannot be read (SafetensorError: Error while deserializing"
    )
    assert said[0].endswith("); falling back to step_000002") and "\n" not in said[0]

    (two / "state.json").write_text("{}")
    (one / "rng.pt").write_bytes(b"")
    with pytest.raises(CheckpointError) as info:
        load_with_fallback(three, load, said.append)
    message = str(info.value)
    assert message.startswith(f"no checkpoint in {tmp_path / 'checkpoints'} can be loaded: {three}: adapter/")
    assert f"{two}: state.json cannot be read (KeyError: 'step')" in message
    assert f"{one / 'rng.pt'}: cannot be loaded safely (EOFError)" in message and "\n" not in message


def _bytes(folder) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_full_disk_while_writing_a_checkpoint_is_one_line_and_leaves_nothing_half_written(
    trainee, tmp_path, monkeypatch
):
    model, optimizer, generator = trainee
    first = save_checkpoint(tmp_path, TrainState(1, 4), model, optimizer, generator, "", keep=3)
    write_text = Path.write_text

    def disk_fills(self, data, *args, **kwargs):  # state.json is where the disk runs out
        if self.name != "state.json":
            return write_text(self, data, *args, **kwargs)
        write_text(self, data[:10])
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", disk_fills)
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(tmp_path, TrainState(2, 8), model, optimizer, generator, "", keep=3)
    monkeypatch.undo()
    message = str(info.value)
    second = tmp_path / "checkpoints" / "step_000002"
    assert message.startswith(
        f"cannot write checkpoint {second}: the disk is full (it needs about {_bytes(first) / 1024:.1f} KiB, "
    )
    assert message.endswith(" are free); free some space, then continue with --resume")
    assert "\n" not in message
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]  # no .tmp left
    assert latest_checkpoint(tmp_path) == first

    def broken(obj, path):  # any other failure is not a full disk: it surfaces as itself
        path.write_bytes(b"x")
        raise RuntimeError("a bug")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(RuntimeError, match="^a bug$"):
        save_checkpoint(tmp_path, TrainState(2, 8), model, optimizer, generator, "", keep=3)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]


def _unshare_mounts() -> bool:
    unshare = shutil.which("unshare")
    return (
        unshare is not None and subprocess.run([unshare, "-rm", "true"], capture_output=True).returncode == 0
    )


@pytest.mark.skipif(not _unshare_mounts(), reason="needs unprivileged mount namespaces (unshare -rm)")
def test_a_checkpoint_onto_a_really_full_disk_is_one_line_whichever_writer_runs_out(tiny_model_dir, tmp_path):
    """Small tmpfs mounts: safetensors, torch.save and Python's own writes each run out of space
    at some size, and each says so differently; every one is the same line, and nothing stays."""
    sizes = [f"{k}k" for k in range(4, 72, 4)]
    folders = [tmp_path / size for size in sizes]
    mounts = " && ".join(
        f"mkdir {f} && mount -t tmpfs -o size={s} tmpfs {f}" for f, s in zip(folders, sizes, strict=True)
    )
    worker = [sys.executable, str(Path(__file__).with_name("disk_full_worker.py")), str(tiny_model_dir)]
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"{mounts} && exec {shlex.join(worker + [str(f) for f in folders])}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["folder"] for r in rows] == [str(f) for f in folders]
    failed = [r for r in rows if r["error"] is not None]
    assert {r["under"] for r in failed} == {"OSError", "SafetensorError", "RuntimeError"}
    for r in failed:
        assert r["error"].startswith(
            f"cannot write checkpoint {r['folder']}/checkpoints/step_000001: the disk is full (it needs about "
        )
        assert "\n" not in r["error"] and r["left"] == []
    assert rows[-1]["error"] is None and rows[-1]["left"] == ["step_000001"]  # 68 KiB holds it


@pytest.mark.parametrize(
    "lora", [{"r": 4, "target_modules": ["q_proj"]}, {"r": 2, "target_modules": ["q_proj", "v_proj"]}]
)
def test_resuming_with_other_lora_settings_is_one_line(trainee, tiny_model_dir, tmp_path, lora):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model, optimizer, generator = trainee
    path = save_checkpoint(
        tmp_path, TrainState(step=1, data_position=4), model, optimizer, generator, "", keep=3
    )
    other = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(**lora))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(
            path, other, torch.optim.AdamW([p for p in other.parameters() if p.requires_grad]), generator
        )
    message = str(info.value)
    assert message.startswith(f"{path}: the adapter") and "\n" not in message
    assert (
        ("lora.rank" in message)
        if lora["r"] == 4
        else ("lora.target_modules" in message and "v_proj" in message)
    )


def test_retention_keeps_the_best_checkpoint_besides_the_newest(trainee, tmp_path):
    """keep_checkpoints=1 used to delete every checkpoint but the newest, the best one included."""
    model, optimizer, generator = trainee
    rows = [
        {"step": 0, "val/success_rate": 0.95},  # validation before training: no checkpoint to keep
        {"step": 1, "loss": 0.1},
        {"step": 2, "loss": 0.1, "val/success_rate": 0.75, "val/reward_mean": 0.2},
        {"step": 3, "loss": 0.1},
        {"step": 4, "loss": 0.1, "val/success_rate": 0.5, "val/reward_mean": 0.9},
        {"step": 5, "loss": 0.1},
    ]
    for row in rows[1:]:
        with (tmp_path / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        save_checkpoint(
            tmp_path,
            TrainState(step=row["step"], data_position=0),
            model,
            optimizer,
            generator,
            "",
            keep=1,
            keep_best_by="val/success_rate",
        )
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == ["step_000002", "step_000005"]

    # another metric, lower is better: step 2's reward (0.2) beats step 4's (0.9)
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for step in (2, 4, 5):
        save_checkpoint(
            other,
            TrainState(step=step, data_position=0),
            model,
            optimizer,
            generator,
            "",
            keep=1,
            keep_best_by="val/reward_mean",
            keep_best_mode="min",
        )
    assert sorted(p.name for p in (other / "checkpoints").iterdir()) == ["step_000002", "step_000005"]

    # "" keeps the newest only, as before
    save_checkpoint(
        tmp_path,
        TrainState(step=6, data_position=0),
        model,
        optimizer,
        generator,
        "",
        keep=1,
        keep_best_by="",
    )
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000006"]
