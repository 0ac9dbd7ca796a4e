"""The calibration loop end to end: `grooves judge score | inspect | compare` against a real HTTP judge."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from grooves.cli import app
from grooves.core.trajectory import Trajectory, TrajectoryGroup
from grooves.judge.batch import read_records
from grooves.judge.calibration import agreement, read_verdicts
from scripted_judge import ScriptedServer, group_reply, shown_responses

runner = CliRunner()

RUBRIC_V1 = """name = "numbers"
version = "1"
[[criteria]]
name = "overall"
text = "How good is the number?"
"""
RUBRIC_V2 = RUBRIC_V1.replace('version = "1"', 'version = "2"').replace("How good", "How well chosen")


def value_of(body: dict) -> float:
    return float(re.search(r"value (\d\.\d+)", body["messages"][1]["content"]).group(1))


def judge_v1(body: dict) -> str:
    return json.dumps({"reason": "as stated", "criteria": {"overall": value_of(body)}})


def judge_v2(body: dict) -> str:
    """Version 2 disagrees with version 1 on two items."""
    v = value_of(body)
    v = {0.7: 0.3, 0.1: 0.6}.get(v, v)
    return json.dumps({"reason": "v2", "criteria": {"overall": v}})


@pytest.fixture
def files(tmp_path):
    items = [{"id": f"i{k}", "input": "Pick a number.", "output": f"value 0.{k}"} for k in range(10)]
    items[9]["output"] += " <script>alert(1)</script>"
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    (tmp_path / "v1.toml").write_text(RUBRIC_V1)
    (tmp_path / "v2.toml").write_text(RUBRIC_V2)
    return tmp_path


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def score_args(server, tmp_path, rubric: str, out: str, *extra: str) -> list[str]:
    return [
        "judge",
        "score",
        str(tmp_path / "items.jsonl"),
        "--rubric",
        str(tmp_path / rubric),
        "--out",
        str(tmp_path / out),
        "--base-url",
        server.base_url,
        "--model",
        "scripted-judge",
        "--cache",
        str(tmp_path / "cache.sqlite"),
        *extra,
    ]


def score(server, tmp_path, rubric: str, out: str, *extra: str) -> str:
    return invoke(*score_args(server, tmp_path, rubric, out, *extra))


def test_score_writes_versioned_records_and_reruns_from_cache(files):
    with ScriptedServer() as server:
        server.fallback = judge_v1
        out = score(server, files, "v1.toml", "s1.jsonl")
        assert len(server.requests) == 10
        again = score(server, files, "v1.toml", "s1.jsonl")
        assert len(server.requests) == 10  # all ten from the cache
    records = read_records(files / "s1.jsonl")
    assert [r.score for r in records] == [k / 10 for k in range(10)]
    assert {(r.rubric, r.rubric_version, len(r.rubric_hash), r.judge_model, r.mode) for r in records} == {
        ("numbers", "1", 12, "scripted-judge", "absolute")
    }
    assert re.search(r"judge requests\s*│\s*10", out) and re.search(
        r"mean score\s*│\s*0\.450 over 10/10", out
    )
    assert re.search(r"judge requests\s*│\s*0", again) and re.search(r"cache hits\s*│\s*10", again)


def test_failed_judgments_are_recorded_and_exit_non_zero_below_min_coverage(files):
    with ScriptedServer() as server:
        server.fallback = lambda body: "garbage" if value_of(body) == 0.3 else judge_v1(body)
        result = runner.invoke(app, score_args(server, files, "v1.toml", "s1.jsonl"))
        assert len(server.requests) == 11  # one repair attempt for i3
        assert result.exit_code == 1
        out = result.output
        records = read_records(files / "s1.jsonl")  # written all the same
        failed = [r for r in records if r.score is None]
        assert [r.id for r in failed] == ["i3"] and "still invalid after one repair" in failed[0].error
        assert re.search(r"failed\s*│\s*1", out) and re.search(r"mean score\s*│\s*0\.467 over 9/10", out)
        assert "9/10 items scored (90%), below --min-coverage 100%" in " ".join(out.split())
        # a lower threshold accepts the same batch; --retry-failed re-asks only i3
        server.fallback = judge_v1
        again = score(server, files, "v1.toml", "s1.jsonl", "--retry-failed", "--min-coverage", "0.9")
        assert len(server.requests) == 12
    assert re.search(r"asked again \(--retry-failed\)\s*│\s*1", again)
    assert [r.score for r in read_records(files / "s1.jsonl")] == [k / 10 for k in range(10)]


def mark(files, lines: list[dict]) -> str:
    path = files / "marks.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def test_inspect_shows_extremes_and_keeps_imported_verdicts(files):
    with ScriptedServer() as server:
        server.fallback = judge_v1
        score(server, files, "v1.toml", "s1.jsonl")
    marks = mark(
        files,
        [
            {"id": "i9", "agree": True},
            {"id": "i7", "agree": "disagree", "note": "padded"},
            {"id": "i0", "agree": True},
            {"id": "i1", "agree": False, "note": "terse but right"},
        ],
    )
    out = invoke(
        "judge",
        "inspect",
        str(files / "s1.jsonl"),
        "--k",
        "3",
        "--verdicts",
        marks,
        "--html",
        str(files / "inspect.html"),
    )
    assert "highest 3" in out and "lowest 3" in out and "kept 4 verdicts" in out
    top_ids = re.findall(r"│ (i\d) ", out.split("lowest 3")[0])
    assert top_ids == ["i9", "i8", "i7"]
    verdicts = {v.id: v for v in read_verdicts(files / "s1.verdicts.jsonl")}
    assert {k: (v.side, v.good) for k, v in verdicts.items()} == {
        "i9": ("top", True),
        "i7": ("top", False),
        "i0": ("bottom", False),
        "i1": ("bottom", True),
    }
    page = (files / "inspect.html").read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>" not in page
    assert "terse but right" in page


def test_inspect_asks_a_person_interactively(files):
    with ScriptedServer() as server:
        server.fallback = judge_v1
        score(server, files, "v1.toml", "s1.jsonl")
    result = runner.invoke(
        app,
        ["judge", "inspect", str(files / "s1.jsonl"), "--k", "2", "--prompt"],
        input="a\nclearly best\nd\nnot that good\ns\nq\n",
    )
    assert result.exit_code == 0, result.output
    verdicts = read_verdicts(files / "s1.verdicts.jsonl")
    assert [(v.id, v.agree, v.note) for v in verdicts] == [
        ("i9", True, "clearly best"),
        ("i8", False, "not that good"),
    ]


def test_inspect_rejects_unknown_ids_clearly(files):
    with ScriptedServer() as server:
        server.fallback = judge_v1
        score(server, files, "v1.toml", "s1.jsonl")
    result = runner.invoke(
        app,
        [
            "judge",
            "inspect",
            str(files / "s1.jsonl"),
            "--verdicts",
            mark(files, [{"id": "nope", "agree": True}]),
        ],
    )
    assert result.exit_code == 1 and "id 'nope' is not in the scores file" in result.output


def test_compare_reports_rubric_and_person_agreement(files):
    with ScriptedServer() as server:
        server.fallback = judge_v1
        score(server, files, "v1.toml", "s1.jsonl")
        server.fallback = judge_v2
        score(server, files, "v2.toml", "s2.jsonl")
    marks = mark(
        files,
        [
            {"id": "i9", "agree": True},
            {"id": "i8", "agree": True},
            {"id": "i7", "agree": False},
            {"id": "i0", "agree": True},
            {"id": "i1", "agree": False},
            {"id": "i2", "agree": True},
        ],
    )
    invoke("judge", "inspect", str(files / "s1.jsonl"), "--k", "3", "--verdicts", marks)
    out = invoke(
        "judge",
        "compare",
        str(files / "s1.jsonl"),
        str(files / "s2.jsonl"),
        "--verdicts",
        str(files / "s1.verdicts.jsonl"),
        "--html",
        str(files / "compare.html"),
    )
    a, b = read_records(files / "s1.jsonl"), read_records(files / "s2.jsonl")
    expected = agreement(a, b)
    assert expected.n == 10 and expected.mean_abs_diff == pytest.approx((0.4 + 0.5) / 10)
    assert f"{expected.pearson:.3f}" in out and f"{expected.spearman:.3f}" in out and "0.090" in out
    # labels: i9 i8 good, i7 bad, i0 bad, i1 good, i2 bad. v1 (score >= 0.5) gets 4 of 6; v2 moved i7 down, i1 up.
    assert re.search(r"A = numbers@1#\w{12}, judge scripted-judge, absolute mode, 10/10 scored", out)
    assert re.search(r"B = numbers@2#\w{12}, judge scripted-judge, absolute mode, 10/10 scored", out)
    rows = {m.group(1): m.group(2) for m in re.finditer(r"│ ([AB])\s*│\s*6/6\s*│\s*([\d.]+)", out)}
    assert rows == {"A": "0.667", "B": "1.000"}
    page = (files / "compare.html").read_text()
    assert page.index(">i1<") < page.index(">i3<")  # largest disagreement listed first


def test_group_mode_scores_a_runs_trajectories_twice_for_position_bias(tmp_path):
    q = {"role": "user", "content": "Pick a number."}
    groups = [
        TrajectoryGroup(
            scenario={"id": f"s{g}"},
            trajectories=[
                Trajectory(messages=[q, {"role": "assistant", "content": f"value 0.{g + k}"}])
                for k in range(3)
            ],
        )
        for g in range(2)
    ]
    (tmp_path / "run.jsonl").write_text("".join(g.model_dump_json() + "\n" for g in groups))
    (tmp_path / "v1.toml").write_text(RUBRIC_V1)

    def biased(body: dict) -> str:
        vals = {i: float(re.search(r"value (\d\.\d+)", t).group(1)) for i, t in shown_responses(body).items()}
        return group_reply({i: v + (0.1 if i == "t1" else 0.0) for i, v in vals.items()})

    with ScriptedServer() as server:
        server.fallback = biased
        out = invoke(
            "judge",
            "score",
            str(tmp_path / "run.jsonl"),
            "--rubric",
            str(tmp_path / "v1.toml"),
            "--out",
            str(tmp_path / "s.jsonl"),
            "--mode",
            "group",
            "--twice",
            "--base-url",
            server.base_url,
            "--model",
            "scripted-judge",
            "--no-cache",
        )
        assert len(server.requests) == 4  # two groups, each judged in two orders
    records = read_records(tmp_path / "s.jsonl")
    assert [r.group for r in records] == ["s0"] * 3 + ["s1"] * 3
    assert [r.id for r in records[:3]] == ["s0-0", "s0-1", "s0-2"]
    assert sorted(round(r.position_bias, 6) for r in records[:3]) == [0.0, 0.1, 0.1]
    assert re.search(r"mean position bias \|A-B\|\s*│\s*0\.067 over 6/6", out)
