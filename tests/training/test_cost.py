"""What a run says about its cost: the plan line at start, a line per step and heartbeats without
progress bars, and `validation.final = false`, which skips the validation after the last step."""

from __future__ import annotations

import json
import re

from grooves.config import SftConfig, parse_config
from grooves.tasks import load_task
from grooves.training import collect, loop, session
from grooves.training.cost import plan_line, sft_plan_line


def _config(**fields):
    return parse_config({"task": "env:corpus_search", "steps": 3, **fields})


def test_the_plan_counts_episodes_tokens_and_validations():
    task = load_task("env:corpus_search", {"max_turns": 6})
    config = _config(
        rollout={"group_size": 4, "groups_per_step": 4, "max_tokens": 96},
        validation={"every": 0, "scenarios": 32},
    )
    assert plan_line(config, task) == (
        "plan: 3 steps of 4 groups x 4 rollouts = 16 episodes a step (up to 6 model calls of at most 96 tokens "
        "each: <= 9,216 sampled tokens a step); validation: 20 scenarios x 1 sample = 20 episodes before step 1 "
        "and after step 3 (40 in all); validation.final = false skips the last"
    )
    config = _config(steps=10, validation={"every": 4, "samples": 2, "final": False, "scenarios": 5})
    assert plan_line(config, load_task("capitals"), start=2).endswith(
        "(at most 64 tokens a model call); validation: 5 scenarios x 2 samples = 10 episodes after steps 4, 8 "
        "(20 in all)"
    )
    assert plan_line(_config(validation={"every": 0, "final": False, "at_start": False}), task).endswith(
        "; no validation"
    )
    sft = SftConfig(data="chats.jsonl", batch_size=8, steps=12)
    assert sft_plan_line(sft, 60, 12, 20) == (
        "plan: 12 steps of 8 chats = 96 chats (1.6 passes over 60); validation: 20 scenarios x 1 sample = 20 "
        "episodes at 2 points (40 in all)"
    )


def test_without_bars_a_run_says_its_plan_each_step_and_a_heartbeat_and_can_skip_the_last_validation(
    peaked_model_dir, tmp_path, capsys, monkeypatch
):
    for module in (collect, session):  # rollouts and validations: a line at every turn of the event loop
        monkeypatch.setattr(module, "HEARTBEAT_S", 0.0)
    config = parse_config(
        {
            "name": "toy",
            "output_dir": str(tmp_path / "run"),
            "steps": 2,
            "task": "toy_tokens",
            "task_options": {"vocab_size": 487, "num_scenarios": 8},
            "model": {"base_model": str(peaked_model_dir)},
            "rollout": {"group_size": 2, "groups_per_step": 2, "max_tokens": 3},
            "validation": {"every": 0, "scenarios": 2, "final": False},
            "logging": {"progress": False, "report": False},
        }
    )
    run_dir = loop.train(config)
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == (
        "plan: 2 steps of 2 groups x 2 rollouts = 4 episodes a step (at most 3 tokens a model call); "
        "validation: 2 scenarios x 1 sample = 2 episodes before step 1 (2 in all)"
    )
    steps = [line for line in out.splitlines() if line.startswith("step ") and " reward " in line]
    assert [line.split()[1] for line in steps] == ["1/2", "2/2"]
    assert any(
        re.fullmatch(r"step 1 rollouts: \d/4 rollouts done after \d+ s", line) for line in out.splitlines()
    )
    assert any(
        re.fullmatch(r"validation @ 0: \d/2 rollouts done after \d+ s", line) for line in out.splitlines()
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/success_rate" in r] == [0]  # none after the last step
    assert (run_dir / "checkpoints" / "step_000002").is_dir()
