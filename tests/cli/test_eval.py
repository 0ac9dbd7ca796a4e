"""`grooves eval`: the in-run validation's figures, with intervals, for a checkpoint or a base model."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grooves.cli import app as cli_app
from grooves.config import parse_config
from grooves.core.trajectory import read_groups
from grooves.judge.batch import read_items
from grooves.report.intervals import wilson_interval
from grooves.training.loop import train

ROOT = Path(__file__).resolve().parents[2]


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
            "logging": {"progress": False, "report": False},
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
    lines = result.stdout.strip().splitlines()[-4:]
    assert lines[3].startswith("parts    in_subset ")  # the task's reward part, averaged
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


# ---- SFT runs, episodes, tool use, paired comparisons ---------------------------------------------
@pytest.fixture(scope="module")
def sft_run(peaked_model_dir, tmp_path_factory):
    """Three steps of `grooves sft`, validated on toy_tokens before the first step and after the last."""
    folder = tmp_path_factory.mktemp("sft")
    data = folder / "chats.jsonl"
    chats = [
        [{"role": "user", "content": f"hello {i}"}, {"role": "assistant", "content": "yes no"}]
        for i in range(4)
    ]
    data.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    sets = ["batch_size=2", "logging.progress=false", "task=toy_tokens", "validation.scenarios=6"]
    sets += ["validation.max_tokens=3", "task_options={vocab_size = 487, num_scenarios = 16}"]
    args = ["sft", "--data", str(data), "--model", str(peaked_model_dir), "-o", str(folder / "run")]
    result = CliRunner().invoke(
        cli_app, [*args, "--steps", "3", "--lr", "0.05", *[a for s in sets for a in ("--set", s)]]
    )
    assert result.exit_code == 0, result.output
    rows = {
        r["step"]: r for r in map(json.loads, (folder / "run" / "metrics.jsonl").read_text().splitlines())
    }
    return folder / "run", rows


def test_eval_scores_an_sft_run_its_checkpoint_and_its_adapter_in_place(sft_run):
    run_dir, rows = sft_run
    checkpoint = run_dir / "checkpoints" / "step_000003"
    for target in (run_dir, checkpoint, checkpoint / "adapter"):
        got = _eval(str(target))
        assert (got["task"], got["step"], got["scenarios"], got["samples"], got["max_tokens"]) == (
            "toy_tokens",
            3,
            6,
            1,
            3,
        )
        # the SFT run's own validation after its last step: the same requests, the same figures
        assert got["success"]["mean"] == rows[3]["val/success_rate"]
        assert got["reward"]["mean"] == rows[3]["val/reward_mean"]
    result = CliRunner().invoke(cli_app, ["eval", str(run_dir)])
    assert result.exit_code == 0 and "unknown field" not in result.output


def test_eval_writes_every_episode_and_counts_tool_use(toy_run, tmp_path):
    run_dir, rows = toy_run
    out = tmp_path / "deep" / "episodes.jsonl"
    got = _eval(str(run_dir), "--samples-out", str(out))
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == got["rollouts"] == 24
    assert [(r["scenario_index"], r["sample"]) for r in lines] == [(g, k) for g in range(8) for k in range(3)]
    assert {r["target"] for r in lines} == {str(run_dir)}
    assert sum(r["reward"] for r in lines) / 24 == pytest.approx(got["reward"]["mean"])
    assert sum(r["success"] for r in lines) / 24 == pytest.approx(got["success"]["mean"])
    assert lines[0]["messages"][-1]["role"] == "assistant" and lines[0]["tool_calls"] == []
    assert got["tool_calls"] == {"total": 0, "per_rollout": 0.0} and got["tool_errors"] is None
    assert got["samples_out"] == str(out)


def test_eval_against_scores_two_stages_on_the_same_requests(toy_run, peaked_model_dir, tmp_path):
    run_dir, rows = toy_run
    out = tmp_path / "both.jsonl"
    got = _eval(str(run_dir), "--against", str(peaked_model_dir), "--samples-out", str(out))
    alone = _eval(str(run_dir))
    assert {k: got[k] for k in ("success", "reward", "rollouts")} == {
        k: alone[k] for k in ("success", "reward", "rollouts")
    }
    other = got["against"]
    assert other["adapter"] is None and other["request_step"] == 2 and other["rollouts"] == 24
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    a = [r for r in lines if r["target"] == str(run_dir)]
    b = [r for r in lines if r["target"] == str(peaked_model_dir)]
    assert [(r["scenario_index"], r["sample"]) for r in a] == [(r["scenario_index"], r["sample"]) for r in b]
    # the base model's first turn sees the same prompts as the adapter's (the same scenarios)
    assert [r["messages"][0] for r in a] == [r["messages"][0] for r in b]
    per_a = [sum(r["reward"] for r in a[g * 3 : g * 3 + 3]) / 3 for g in range(8)]
    per_b = [sum(r["reward"] for r in b[g * 3 : g * 3 + 3]) / 3 for g in range(8)]
    diffs = [x - y for x, y in zip(per_a, per_b, strict=True)]
    paired = got["paired"]["reward"]
    assert paired["difference"] == pytest.approx(sum(diffs) / 8)
    assert (paired["better"], paired["worse"], paired["same"]) == (
        sum(d > 0 for d in diffs),
        sum(d < 0 for d in diffs),
        sum(d == 0 for d in diffs),
    )
    assert paired["low"] <= paired["difference"] <= paired["high"]
    text = CliRunner().invoke(cli_app, ["eval", str(run_dir), "--against", str(peaked_model_dir)])
    assert text.exit_code == 0, text.output
    assert f"against {peaked_model_dir}, on the same requests:" in text.stdout
    assert "difference per scenario (target - against), over 8 scenarios:" in text.stdout


def test_eval_of_an_environment_counts_tool_calls_and_reward_parts_and_says_the_threshold(
    tiny_model_dir, tmp_path, monkeypatch
):
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(ROOT / "examples" / "envs")
    args = [
        str(tiny_model_dir),
        "--task",
        "library_desk:SPEC",
        "--scenarios",
        "2",
        "--max-tokens",
        "8",
    ]
    got = _eval(*args, "--samples-out", str(tmp_path / "episodes.jsonl"))
    assert got["task"] == "library_desk:SPEC" and got["success_threshold"] == 1.0
    assert set(got["reward_parts"]) == {"action", "answer"}
    episodes = [json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    assert got["tool_calls"]["total"] == sum(len(e["tool_calls"]) for e in episodes)
    assert got["tool_errors"]["total"] == sum(e["metrics"]["env_tool_errors"] for e in episodes)
    assert {e["scenario_id"] for e in episodes} == {"library_desk-003", "library_desk-007"}
    text = CliRunner().invoke(cli_app, ["eval", *args])
    assert "a rollout succeeds at a grade >= 1.0 (success_threshold)" in text.stdout
    assert "parts    action " in text.stdout


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
