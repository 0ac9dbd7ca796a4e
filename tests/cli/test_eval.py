"""`grooves eval`: the in-run validation's figures, with intervals, for a checkpoint or a base model."""

from __future__ import annotations

import json
import statistics

import pytest
from typer.testing import CliRunner

from grooves.cli import app as cli_app
from grooves.config import parse_config
from grooves.core.trajectory import read_groups
from grooves.judge.batch import read_items
from grooves.report.intervals import wilson_interval
from grooves.training.loop import train


@pytest.fixture(scope="module")
def toy_run(peaked_model_dir, tmp_path_factory):
    """Two steps of the toy task, validated before the first step and after the last."""
    out = tmp_path_factory.mktemp("eval") / "run"
    config = parse_config(
        {
            "name": "toy",
            "output_dir": str(out),
            "seed": 1,
            "steps": 2,
            "task": "toy_tokens",
            "task_options": {"vocab_size": 487, "num_scenarios": 16},
            "model": {"base_model": str(peaked_model_dir)},
            "rollout": {"group_size": 4, "groups_per_step": 4, "max_tokens": 4, "concurrency": 1},
            "optim": {"lr": 0.2},
            "lora": {"rank": 4, "alpha": 8},
            "validation": {"every": 0, "scenarios": 8, "samples": 3},
            "logging": {"progress": False},
        }
    )
    run_dir = train(config)
    rows = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    return run_dir, rows


def _eval(*args: str) -> dict:
    result = CliRunner().invoke(cli_app, ["eval", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_eval_of_a_run_repeats_the_validation_of_its_last_checkpoint(toy_run):
    run_dir, rows = toy_run
    got = _eval(str(run_dir))
    assert got["adapter"] == str(run_dir / "checkpoints" / "step_000002" / "adapter") and got["step"] == 2
    assert (got["task"], got["split"], got["scenarios"], got["samples"], got["rollouts"], got["failed"]) == (
        "toy_tokens",
        "validation",
        8,
        3,
        24,
        0,
    )
    # the same rollouts as the run's own validation at step 2: the same figures, exactly
    assert got["success"]["mean"] == rows[2]["val/success_rate"]
    assert got["reward"]["mean"] == rows[2]["val/reward_mean"]
    wins = round(got["success"]["mean"] * 24)
    assert (got["success"]["low"], got["success"]["high"]) == pytest.approx(wilson_interval(wins, 24))
    assert got["success"]["interval"] == "wilson"
    assert got["reward"]["interval"].startswith("bootstrap over scenarios")
    assert got["reward"]["low"] <= got["reward"]["mean"] <= got["reward"]["high"]


def test_eval_of_the_base_model_repeats_the_validation_before_training(toy_run, peaked_model_dir):
    run_dir, rows = toy_run
    got = _eval(
        str(peaked_model_dir),
        *("--task", "toy_tokens", "--option", "vocab_size=487", "--option", "num_scenarios=16"),
        *("--samples", "3", "--scenarios", "8", "--max-tokens", "4", "--seed", "1"),
    )
    assert got["adapter"] is None and got["step"] == 0
    assert got["success"]["mean"] == rows[0]["val/success_rate"]
    assert got["reward"]["mean"] == rows[0]["val/reward_mean"]
    assert rows[0]["val/reward_mean"] != rows[2]["val/reward_mean"]  # training moved it: the two differ


def test_eval_prints_the_figures_with_their_intervals(toy_run):
    run_dir, rows = toy_run
    result = CliRunner().invoke(cli_app, ["eval", str(run_dir / "checkpoints" / "step_000002")])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()[-3:]
    assert lines[0].startswith("toy_tokens validation: 8 scenarios x 3 samples = 24 rollouts (0 failed), ")
    low, high = wilson_interval(round(rows[2]["val/success_rate"] * 24), 24)
    assert (
        lines[1] == f"success  {rows[2]['val/success_rate']:.3f}  95% interval {low:.3f}-{high:.3f} (Wilson)"
    )
    assert lines[2].startswith(f"reward   {rows[2]['val/reward_mean']:.3f}  95% interval ")
    assert lines[2].endswith("(bootstrap over scenarios)")


@pytest.mark.parametrize(
    "args,line",
    [
        (
            ["smollm2-135m"],
            "grooves eval: --task: name the task to evaluate on (a run folder or checkpoint names its own)",
        ),
        (["smollm2-135m", "--task", "nosuch"], "grooves eval: --task: 'nosuch' is not built in"),
        (
            ["smollm2-135m", "--task", "toy_tokens", "--split", "holdout"],
            "grooves eval: --split 'holdout': use validation, test or train",
        ),
        (
            ["smollm2-135m", "--task", "capitals", "--split", "test"],
            "grooves eval: split 'test' is unknown; use 'train' or 'validation'",
        ),
    ],
)
def test_bad_eval_arguments_are_one_line(args, line):
    result = CliRunner().invoke(cli_app, ["eval", *args])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert result.stderr.strip().splitlines()[0].startswith(line), result.stderr


def test_eval_out_writes_its_rollouts_as_a_batch_for_the_judge(peaked_model_dir, tmp_path):
    out = tmp_path / "batch.jsonl"
    got = _eval(
        str(peaked_model_dir),
        *("--task", "toy_tokens", "--option", "vocab_size=487", "--option", "num_scenarios=16"),
        *("--split", "train", "--samples", "3", "--scenarios", "8", "--max-tokens", "4", "--out", str(out)),
    )
    groups = read_groups(out)
    assert [len(g.trajectories) for g in groups] == [3] * 8
    assert statistics.fmean(t.reward for g in groups for t in g.trajectories) == got["reward"]["mean"]
    items = read_items(out)  # what `grooves judge score` reads: one item per rollout, grouped by scenario
    assert len(items) == 24 and len({i.group for i in items}) == 8
    assert items[0].output == groups[0].trajectories[0].messages[-1]["content"]
