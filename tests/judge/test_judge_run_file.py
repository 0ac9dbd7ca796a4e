"""`[judge]` in a run file: `grooves train` scores each group with a group judge over HTTP, mixed
with the task's reward; a judge that cannot be used stops the start in one line."""

from __future__ import annotations

import json
import statistics

import pytest
import tomli_w
from typer.testing import CliRunner

from grooves.cli import app as cli_app
from grooves.core.trajectory import read_groups
from scripted_judge import ScriptedServer, group_reply, shown_responses

RUBRIC = """
name = "agent"
version = "1"
instructions = "Judge how well each response does what the user asked."

[[criteria]]
name = "overall"
text = "How well does the response do the task?"
"""


def length_score(text: str) -> float:
    """The scripted judge's rule: a response's length in characters, mod 4, over 3."""
    return (len(text) % 4) / 3


def by_length(body: dict) -> str:
    return group_reply(
        {i: length_score(t.removeprefix("[assistant] ")) for i, t in shown_responses(body).items()}
    )


@pytest.fixture(autouse=True)
def _no_judge_env(monkeypatch):
    for name in ("GROOVES_JUDGE_BASE_URL", "GROOVES_JUDGE_MODEL", "GROOVES_JUDGE_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def _run_file(tmp_path, model_dir, judge: dict) -> str:
    rubric = tmp_path / "agent.toml"
    rubric.write_text(RUBRIC)
    data = {
        "name": "judged",
        "output_dir": str(tmp_path / "run"),
        "seed": 3,
        "steps": 2,
        "task": "toy_tokens",
        "task_options": {"vocab_size": 487, "num_scenarios": 8},
        "model": {"base_model": str(model_dir)},
        "rollout": {"group_size": 3, "groups_per_step": 2, "max_tokens": 3},
        "optim": {"lr": 1e-2},
        "lora": {"rank": 2, "alpha": 4},
        "validation": {"every": 0, "scenarios": 2, "samples": 2},
        "logging": {"progress": False, "report": False},
        "judge": {"model": "scripted-judge", "rubric": str(rubric), "cache": False, **judge},
    }
    path = tmp_path / "run.toml"
    path.write_text(tomli_w.dumps(data))
    return str(path)


def test_grooves_train_scores_groups_with_the_judge_of_the_run_file(tiny_model_dir, tmp_path):
    with ScriptedServer() as server:
        server.fallback = by_length
        run_file = _run_file(tmp_path, tiny_model_dir, {"base_url": server.base_url, "weight": 0.25})
        result = CliRunner().invoke(cli_app, ["train", run_file])
        assert result.exit_code == 0, result.output
    groups_requests = [b for b in server.requests if "messages" in b]
    assert len(groups_requests) == 2 * 2 + 2 * 2  # 2 groups x 2 steps, 2 validation groups x 2 validations
    assert all(b["model"] == "scripted-judge" for b in groups_requests)
    assert all(
        "How well does the response do the task?" in b["messages"][0]["content"] for b in groups_requests
    )
    run_dir = tmp_path / "run"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss" in r]
    for row in steps:
        groups = read_groups(run_dir / "samples" / f"step_{row['step']:06d}.jsonl")
        ok = [t for g in groups for t in g.ok]
        assert len(ok) == 6 and (row["judge_items"], row["judge_failures"], row["judge_requests"]) == (
            6,
            0,
            2,
        )
        for t in ok:
            assert t.rewards["judge"] == pytest.approx(length_score(t.completion))
            assert t.reward == pytest.approx(0.75 * t.rewards["task"] + 0.25 * t.rewards["judge"])
        assert row["reward_mean"] == pytest.approx(statistics.fmean(t.reward for t in ok))
        assert row["reward_judge_mean"] == pytest.approx(statistics.fmean(t.rewards["judge"] for t in ok))
    assert rows[0]["val/judge_items"] == 4  # validation is scored by the same judge


def test_a_gate_zeroes_what_the_judge_scores_below_it(tiny_model_dir, tmp_path):
    with ScriptedServer() as server:
        server.fallback = by_length
        run_file = _run_file(
            tmp_path, tiny_model_dir, {"base_url": server.base_url, "weight": 0.0, "gate": 0.5}
        )
        result = CliRunner().invoke(cli_app, ["train", run_file, "--set", "steps=1"])
        assert result.exit_code == 0, result.output
    groups = read_groups(tmp_path / "run" / "samples" / "step_000001.jsonl")
    ok = [t for g in groups for t in g.ok]
    assert {t.reward == 0.0 for t in ok if t.rewards["judge"] < 0.5} <= {True}
    assert [t.reward for t in ok if t.rewards["judge"] >= 0.5] == [
        t.rewards["task"] for t in ok if t.rewards["judge"] >= 0.5
    ]
    assert any(t.rewards["judge"] < 0.5 for t in ok) and any(
        t.metadata.get("gated_by") == ["judge"] for t in ok
    )


@pytest.mark.parametrize(
    "judge,expected",
    [
        ({"base_url": "http://127.0.0.1:9/v1"}, "judge: cannot reach the judge at http://127.0.0.1:9/v1"),
        (
            {"base_url": "SERVER", "model": "other"},
            "judge: the judge endpoint SERVER/ does not serve model 'other'",
        ),
        (
            {"base_url": "SERVER", "rubric": "nowhere.toml"},
            "judge.rubric: rubric file not found: nowhere.toml",
        ),
        ({"base_url": None}, "judge.base_url: judge base_url is not set"),
        (
            {"base_url": "SERVER", "reward": "no_such_module:fn"},
            "judge.reward: no_such_module:fn: No module named",
        ),
    ],
)
def test_a_judge_that_cannot_be_used_stops_the_start_in_one_line(tiny_model_dir, tmp_path, judge, expected):
    with ScriptedServer() as server:
        judge = {k: (server.base_url if v == "SERVER" else v) for k, v in judge.items()}
        expected = expected.replace("SERVER", server.base_url)
        run_file = _run_file(tmp_path, tiny_model_dir, {k: v for k, v in judge.items() if v is not None})
        result = CliRunner().invoke(cli_app, ["train", run_file])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith(f"{run_file}: {expected}"), lines[0]
    assert not (tmp_path / "run" / "config.toml").exists()  # stopped before the run folder changed
