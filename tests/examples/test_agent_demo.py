"""`make agent-demo`'s steps on the tiny model: demonstrations, the run file's [sft] stage, RL, validation before and after."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from grooves.cli import app as cli_app
from grooves.config import load_config
from grooves.training.loop import train

ROOT = Path(__file__).resolve().parents[2]


def test_the_agent_demo_runs_end_to_end_on_a_tiny_model(tiny_model_dir, tmp_path):
    demos = tmp_path / "demos.jsonl"
    result = CliRunner().invoke(
        cli_app, ["env", "demos", "corpus_search", "--split", "train", "--out", str(demos), "--copies", "2"]
    )
    assert result.exit_code == 0 and "160 demonstrations from 80 train scenarios" in result.output, (
        result.output
    )
    config = load_config(
        ROOT / "examples" / "agents" / "corpus_search_demo.toml",
        {
            "model.base_model": str(tiny_model_dir),
            "output_dir": str(tmp_path / "run"),
            "sft.data": str(demos),
            "sft.steps": 1,
            "sft.batch_size": 2,
            "steps": 1,
            "task_options.max_turns": 2,
            "rollout.group_size": 2,
            "rollout.groups_per_step": 1,
            "rollout.max_tokens": 8,
            "validation.scenarios": 2,
            "logging.progress": False,
        },
    )
    run_dir = train(config)
    assert (run_dir / "sft" / "checkpoints" / "step_000001").is_dir()
    assert (run_dir / "checkpoints" / "step_000001").is_dir() and (run_dir / "report.html").is_file()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/success_rate" in r] == [0, 1]  # on the SFT adapter, then after RL
