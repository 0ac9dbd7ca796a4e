"""The adapter registry of a run folder: latest, best by a validation metric, resolving sources."""

from __future__ import annotations

import pytest
from adapters_support import make_run
from typer.testing import CliRunner

from grooves.adapters.registry import AdapterNotFound, AdapterRegistry, resolve_adapter
from grooves.cli import app as cli_app


def test_latest_best_and_step(tiny_model_dir, tmp_path):
    run = make_run(tmp_path / "run", {5: 0.4, 10: 0.7, 15: None, 20: 0.7}, model_dir=tiny_model_dir)
    registry = AdapterRegistry(run)
    assert [e.step for e in registry.checkpoints()] == [5, 10, 15, 20]
    assert registry.latest().step == 20
    assert registry.best().step == 20  # tie with step 10: the later one
    assert registry.best(mode="min").step == 5
    assert registry.best("reward_mean", "min").step == 5
    assert resolve_adapter(run, "best") == run / "checkpoints" / "step_000020" / "adapter"
    assert resolve_adapter(run, "10") == run / "checkpoints" / "step_000010" / "adapter"
    assert (
        resolve_adapter(run / "checkpoints" / "step_000005")
        == run / "checkpoints" / "step_000005" / "adapter"
    )
    adapter = run / "checkpoints" / "step_000005" / "adapter"
    assert resolve_adapter(adapter) == adapter


def test_incomplete_checkpoints_and_missing_metrics(tiny_model_dir, tmp_path):
    run = make_run(tmp_path / "run", {1: None, 2: None}, model_dir=tiny_model_dir)
    (run / "checkpoints" / "step_000003.tmp").mkdir()  # a write that was interrupted
    (run / "checkpoints" / "step_000002" / "state.json").unlink()
    registry = AdapterRegistry(run)
    assert [e.step for e in registry.checkpoints()] == [1]
    with pytest.raises(AdapterNotFound, match="keep_checkpoints"):
        registry.best()
    with pytest.raises(AdapterNotFound, match=r"kept steps: \[1\]"):
        registry.step(7)
    with pytest.raises(ValueError, match="select"):
        resolve_adapter(run, "newest")
    with pytest.raises(AdapterNotFound, match="not an adapter"):
        resolve_adapter(tmp_path)


def test_list_command_marks_the_best(tiny_model_dir, tmp_path):
    run = make_run(tmp_path / "run", {1: 0.25, 2: 0.75, 3: 0.5}, model_dir=tiny_model_dir)
    result = CliRunner().invoke(cli_app, ["adapters", "list", str(run)])
    assert result.exit_code == 0, result.output
    lines = {
        int(line.split()[1]): line
        for line in result.output.splitlines()
        if line.split()[1:2] and line.split()[1].isdigit()
    }
    assert sorted(lines) == [1, 2, 3]
    assert "0.75" in lines[2] and "*" in lines[2]
    assert "*" not in lines[1] and "*" not in lines[3]
