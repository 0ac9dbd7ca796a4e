"""Built-in tasks: the capitals reward by hand, task loading errors, an environment as a task."""

from __future__ import annotations

import json

import pytest

from grooves.config import parse_config
from grooves.tasks import load_task
from grooves.tasks.capitals import CapitalsTask, score_answer
from grooves.training.loop import train


@pytest.mark.parametrize(
    "answer,reward,success",
    [
        ("Paris.", 1.0, True),
        ("The capital of France is Paris.", 1.0, True),  # 6 words
        ("The capital city of France is Paris.", 6 / 7, False),  # correct but long: partial credit
        ("The capital of France is Paris.\nIt is big.", 6 / 9 * 0.5, False),  # 9 words on two lines
        ("Lyon.", 0.0, False),
        ("", 0.0, False),
    ],
)
def test_capitals_reward(answer, reward, success):
    got, ok, _ = score_answer(answer, "Paris", max_words=6)
    assert got == pytest.approx(reward)
    assert ok is success


def test_capitals_splits_are_disjoint():
    task = CapitalsTask()
    train_c = {s["country"] for s in task.scenarios("train")}
    val_c = {s["country"] for s in task.scenarios("validation")}
    assert train_c and val_c and not train_c & val_c
    with pytest.raises(ValueError, match="split 'test' is unknown"):
        task.scenarios("test")


def test_load_task_errors():
    with pytest.raises(ValueError, match="not built in"):
        load_task("nonsense")
    with pytest.raises(ValueError, match="cannot import"):
        load_task("no_such_module_xyz:task")
    assert load_task("grooves.tasks.capitals:CapitalsTask", {"max_words": 4}).max_words == 4


def test_environment_task_trains_with_the_rl_core(tiny_model_dir, tmp_path):
    """`task = "env:support_desk"`: episodes through the policy server, grader parts logged per signal."""
    config = parse_config(
        {
            "output_dir": str(tmp_path / "env"),
            "steps": 1,
            "task": "env:support_desk",
            "model": {"base_model": str(tiny_model_dir)},
            "rollout": {"group_size": 2, "groups_per_step": 1, "max_tokens": 8},
            "validation": {"every": 0, "scenarios": 1},
            "logging": {"progress": False, "report": False},
        }
    )
    run_dir = train(config)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step = rows[-1]
    assert step["step"] == 1 and step["rollouts"] == 2 and step["failed_rollouts"] == 0
    assert any(k.startswith("reward/") for k in step)
    group = json.loads((run_dir / "samples" / "step_000001.jsonl").read_text().splitlines()[0])
    assert group["trajectories"][0]["tools"], "the environment's tools reach the policy"
