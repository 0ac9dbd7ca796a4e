"""Multi-task runs: draws follow the weights, the stream resumes exactly, metrics come per task."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from grooves.config import ConfigError, parse_config
from grooves.core.trajectory import Trajectory
from grooves.tasks.mixture import TASK_KEY, TaskMixture, WeightedTask
from grooves.training.data import MixtureStream, ScenarioStream
from grooves.training.loop import train


class ListTask:
    """A task whose rollout records the scenario it was given (no model needed)."""

    def __init__(self, name: str, n_train: int, n_val: int = 3):
        self.name = name
        self._splits = {
            "train": [{"i": i} for i in range(n_train)],
            "validation": [{"v": i} for i in range(n_val)],
        }

    def scenarios(self, split):
        return self._splits[split]

    async def rollout(self, model, scenario):
        return Trajectory(reward=float(len(self.name)), metadata={"seen": dict(scenario)})


def _mixture(weights: dict[str, float]) -> TaskMixture:
    return TaskMixture([WeightedTask(n, ListTask(n, 5 + k), w) for k, (n, w) in enumerate(weights.items())])


def _chi_square(counts: Counter, probs: dict[str, float], total: int) -> float:
    return sum((counts[n] - total * p) ** 2 / (total * p) for n, p in probs.items())


def test_draws_follow_the_weights():
    weights = {"a": 0.5, "b": 0.3, "c": 0.2}
    stream = MixtureStream(_mixture(weights), seed=3)
    total = 6000
    counts = Counter(s[TASK_KEY] for _, s in stream.take(total))
    # chi-square with 2 degrees of freedom: P(X > 16.3) = 0.0003 for a correct sampler
    assert _chi_square(counts, weights, total) < 16.3, counts
    # the bound has power: the same draws are far from a uniform mix
    assert _chi_square(counts, {n: 1 / 3 for n in weights}, total) > 100


def test_each_task_keeps_its_own_epoch_order():
    mixture = _mixture({"a": 2.0, "b": 1.0})
    picked = MixtureStream(mixture, seed=5).take(60)
    for member in mixture.members:
        mine = [s["i"] for _, s in picked if s[TASK_KEY] == member.name]
        alone = [s["i"] for _, s in ScenarioStream(member.task.scenarios("train"), 5).take(len(mine))]
        assert mine == alone, member.name


@pytest.mark.parametrize("cut", [0, 1, 7, 23])
def test_stream_resumes_from_its_position(cut):
    mixture = _mixture({"a": 0.7, "b": 0.3})
    full = MixtureStream(mixture, seed=11).take(40)
    first = MixtureStream(mixture, seed=11)
    first.take(cut)
    resumed = MixtureStream(mixture, seed=11, position=first.position)
    assert first.position == cut
    assert resumed.take(40 - cut) == full[cut:]


def test_validation_interleaves_tasks():
    mixture = TaskMixture(
        [WeightedTask("a", ListTask("a", 4, n_val=3), 1.0), WeightedTask("b", ListTask("b", 4, n_val=1), 9.0)]
    )
    val = mixture.scenarios("validation")
    assert [s[TASK_KEY] for s in val] == ["a", "b", "a", "a"]
    assert [s[TASK_KEY] for s in val[:2]] == ["a", "b"]  # a short validation still sees every task


def test_rollout_goes_to_the_scenarios_task():
    mixture = TaskMixture(
        [WeightedTask("a", ListTask("a", 3), 1.0), WeightedTask("bb", ListTask("bb", 3), 1.0)]
    )
    ((_, scenario),) = [(i, s) for i, s in MixtureStream(mixture, seed=0).take(8) if s[TASK_KEY] == "bb"][:1]
    traj = asyncio.run(mixture.rollout(None, scenario))
    assert traj.reward == 2.0 and traj.metadata["task"] == "bb"
    assert traj.metadata["seen"] == {"i": scenario["i"]}  # the member sees its own scenario, untagged
    with pytest.raises(ValueError, match="not one of this mixture's tasks"):
        asyncio.run(mixture.rollout(None, {"i": 0, TASK_KEY: "zzz"}))


def test_config_errors_name_the_problem():
    with pytest.raises(ConfigError, match="either `task`"):
        parse_config({"task": "toy_tokens", "tasks": [{"task": "capitals"}]})
    with pytest.raises(ConfigError, match="unique"):
        parse_config({"tasks": [{"task": "capitals"}, {"task": "capitals"}]})
    with pytest.raises(ConfigError, match=r"tasks\.0\.weight"):
        parse_config({"tasks": [{"task": "capitals", "weight": 0}]})
    with pytest.raises(ValueError, match="weight must be > 0"):
        TaskMixture([WeightedTask("a", ListTask("a", 2), -1.0)])


def test_multitask_run_logs_per_task_metrics_and_resumes(tiny_model_dir, tmp_path):
    def config(out):
        return parse_config(
            {
                "name": "mix",
                "output_dir": str(out),
                "seed": 2,
                "steps": 3,
                "tasks": [
                    {
                        "task": "toy_tokens",
                        "name": "quarter",
                        "weight": 0.7,
                        "options": {"vocab_size": 487, "num_scenarios": 8},
                    },
                    {
                        "task": "toy_tokens",
                        "name": "half",
                        "weight": 0.3,
                        "options": {"vocab_size": 487, "vocab_fraction": 0.5, "num_scenarios": 8},
                    },
                ],
                "model": {"base_model": str(tiny_model_dir)},
                "rollout": {"group_size": 2, "groups_per_step": 4, "max_tokens": 3},
                "lora": {"rank": 2, "alpha": 4},
                "validation": {"every": 0, "scenarios": 4},
                "logging": {"progress": False, "report": False},
            }
        )

    rows = [
        json.loads(line)
        for line in (train(config(tmp_path / "full")) / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in rows if "loss" in r]
    for r in steps:
        counts = [r.get(f"task/{n}/groups", 0.0) for n in ("quarter", "half")]
        assert sum(counts) == 4  # every group of the step is attributed to one task
        for n in ("quarter", "half"):
            if r.get(f"task/{n}/groups"):
                assert 0.0 <= r[f"task/{n}/reward_mean"] <= 1.0
    for r in (rows[0], rows[-1]):  # validation before the first and after the last step, per task
        assert {"val/task/quarter/success_rate", "val/task/half/success_rate"} <= r.keys()
    state = json.loads((tmp_path / "full" / "checkpoints" / "step_000003" / "state.json").read_text())
    assert state["data_position"] == 12  # draws so far: the whole mixture state

    part = tmp_path / "part"
    train(config(part), stop_after=1)
    resumed = [
        json.loads(line)
        for line in (train(config(part), resume=True) / "metrics.jsonl").read_text().splitlines()
    ]
    for a, b in zip(rows, resumed, strict=True):
        assert {k: v for k, v in a.items() if k.startswith("task/")} == {
            k: v for k, v in b.items() if k.startswith("task/")
        }
