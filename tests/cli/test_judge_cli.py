"""`grooves judge` on the command line: no success over nothing, calibration pages that say what they show.

The endpoint is checked before scoring, repeated identical failures stop a batch, every mean
comes with its coverage, failures print one line per group, and text that looks like Rich markup
is printed as written. `inspect` breaks ties by a seeded order and says so, and always shows the
person's labelled items and the judge's failures; verdicts imported twice are kept once; `compare`
names each side's judge and warns when a side scored few items.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grooves.cli import app
from grooves.judge.batch import ScoreRecord, read_records, write_records
from grooves.judge.calibration import read_verdicts
from scripted_judge import ScriptedServer, Status, group_reply, shown_responses

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def flat(text: str) -> str:
    """CLI output with line wrapping undone, for matching sentences."""
    return " ".join(text.split())


def items_file(tmp_path: Path, n: int = 10, inputs: int = 1) -> Path:
    path = tmp_path / "items.jsonl"
    rows = [
        {"id": f"i{k}", "input": f"Pick a number, [user] {k % inputs}.", "output": f"value 0.{k}"}
        for k in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def score(server: ScriptedServer, tmp_path: Path, *extra: str, base_url: str | None = None):
    return runner.invoke(
        app,
        [
            "judge",
            "score",
            str(tmp_path / "items.jsonl"),
            "--out",
            str(tmp_path / "s.jsonl"),
            "--base-url",
            base_url or server.base_url,
            "--model",
            "scripted-judge",
            "--no-cache",
            "--concurrency",
            "1",
            *extra,
        ],
    )


def by_value(body: dict) -> str:
    value = float(re.search(r"value (\d\.\d+)", body["messages"][1]["content"]).group(1))
    return json.dumps({"reason": "as stated", "criteria": {"overall": value}})


def test_a_base_url_without_v1_fails_before_scoring_with_the_fix(tmp_path):
    items_file(tmp_path)
    with ScriptedServer() as server:
        root = server.base_url.removesuffix("/v1")
        result = score(server, tmp_path, base_url=root)
        assert server.requests == []
    assert result.exit_code == 1
    assert (
        f"answered 404 (not found); OpenAI-compatible servers answer under /v1: try --base-url {root}/v1"
        in flat(result.output)
    )
    assert not (tmp_path / "s.jsonl").exists()


def test_a_model_the_server_does_not_serve_fails_before_scoring(tmp_path):
    items_file(tmp_path)
    with ScriptedServer() as server:
        server.models = ["judge-7b"]
        result = score(server, tmp_path)
        assert server.requests == []
        server.fallback = by_value  # --no-check skips the question (for servers that list no models)
        assert score(server, tmp_path, "--no-check").exit_code == 0
    assert result.exit_code == 1
    assert (
        "does not serve model 'scripted-judge'; it serves: judge-7b. Pass --model with one of them"
        in flat(result.output)
    )


def test_repeated_identical_failures_stop_the_batch_and_print_one_line_each(tmp_path):
    items_file(tmp_path)
    with ScriptedServer() as server:
        server.fallback = lambda body: Status(404)
        result = score(server, tmp_path, "--no-check")
        assert len(server.requests) == 3  # then it stopped sending
    out = flat(result.output)
    assert result.exit_code == 1 and "mean score │ - over 0/10" in out
    assert re.search(r"failed 3 items \(i0, i1, i2\): judge request to \S+ failed: Error code: 404", out)
    assert (
        "failed 7 items (i3, i4, i5, i6 and 3 more): not judged: stopped after 3 identical failures in a row"
        in out
    )
    assert len(re.findall(r"\bfailed \d+ items", out)) == 2
    assert (
        "0/10 items scored (0%), below --min-coverage 100%; re-ask the 10 failed with --retry-failed" in out
    )
    records = read_records(tmp_path / "s.jsonl")
    assert [r.error is not None for r in records] == [True] * 10


def test_group_failures_print_one_line_per_group_and_retry_asks_only_them(tmp_path):
    items_file(tmp_path, n=6, inputs=2)  # groups: i0 i2 i4 | i1 i3 i5

    def judge(body: dict):
        if "[user] 1." in body["messages"][1]["content"]:
            return "I cannot decide about [user] 1."
        return group_reply({i: float(t.split("value ")[1]) for i, t in shown_responses(body).items()})

    with ScriptedServer() as server:
        server.fallback = judge
        result = score(server, tmp_path, "--mode", "group")
        assert len(server.requests) == 3  # group 0, group 1 and its repair
        out = flat(result.output)
        assert result.exit_code == 1 and "mean score │ 0.200 over 3/6" in out
        assert "failed 3 items (i1, i3, i5): judge reply invalid, and still invalid after one repair" in out
        assert len(re.findall(r"failed \d+ items|failed i\d", out)) == 1
        assert "'I cannot decide about [user] 1.'" in out  # printed as written, not swallowed as markup
        server.fallback = lambda body: group_reply(
            {i: float(t.split("value ")[1]) for i, t in shown_responses(body).items()}
        )
        again = score(server, tmp_path, "--mode", "group", "--retry-failed")
        assert len(server.requests) == 4  # only the failed group was asked again
    assert again.exit_code == 0 and "mean score │ 0.250 over 6/6" in flat(again.output)
    assert [r.score for r in read_records(tmp_path / "s.jsonl")] == pytest.approx([k / 10 for k in range(6)])


def test_retry_failed_refuses_a_file_scored_by_another_judge(tmp_path):
    items_file(tmp_path, n=2)
    with ScriptedServer() as server:
        server.fallback = by_value
        assert score(server, tmp_path).exit_code == 0
        server.models = ["other"]
        result = runner.invoke(
            app,
            [
                "judge",
                "score",
                str(tmp_path / "items.jsonl"),
                "--out",
                str(tmp_path / "s.jsonl"),
                "--base-url",
                server.base_url,
                "--model",
                "other",
                "--retry-failed",
            ],
        )
    assert result.exit_code == 1
    assert "judge 'scripted-judge', mode absolute; this run is rubric" in flat(result.output)
    assert "judge 'other'" in flat(result.output)


def test_markup_in_messages_is_printed_as_written(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "r"\nversion = "1"\ncolour = "red"\n[[criteria]]\nname = "a"\ntext = "a?"\n')
    result = runner.invoke(
        app,
        [
            "judge",
            "score",
            str(items_file(tmp_path)),
            "--rubric",
            str(bad),
            "--out",
            "x.jsonl",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "m",
        ],
    )
    assert result.exit_code == 1
    assert "allowed: name, version, instructions, [[criteria]] with name, text, weight, choices" in flat(
        result.output
    )


def record(
    i: str, score: float | None, output: str = "", judge: str = "scripted-judge", mode: str = "absolute"
) -> ScoreRecord:
    return ScoreRecord(
        id=i,
        input="q",
        output=output or f"answer {i}",
        score=score,
        criteria={} if score is None else {"overall": score},
        reason="" if score is None else f"reason {i}",
        error="timed out" if score is None else None,
        rubric="r",
        rubric_version="1",
        rubric_hash="abcdef012345",
        judge_model=judge,
        mode=mode,
    )


def tied_scores(tmp_path: Path) -> Path:
    """15 items at 1.0, five in the middle, a failure: the shape of a weak judge's scores."""
    records = [record(f"top{k:02d}", 1.0) for k in range(15)] + [
        record(f"mid{k}", 0.5 - k / 10) for k in range(5)
    ]
    records.append(record("fail", None, output="[assistant] never judged"))
    path = tmp_path / "scores.jsonl"
    write_records(path, records)
    return path


def shown_ids(out: str, title: str) -> list[str]:
    part = out.split(title)[1].split("ties:")[0]
    return re.findall(r"│ (top\d\d|mid\d) ", part)


def test_inspect_samples_ties_by_seed_says_so_and_shows_labels_and_failures(tmp_path):
    path = tied_scores(tmp_path)
    marks = tmp_path / "marks.jsonl"
    marks.write_text(json.dumps({"id": "mid0", "agree": False, "note": "[note] fine really"}) + "\n")
    args = ["judge", "inspect", str(path), "--k", "3", "--no-prompt"]
    first = runner.invoke(app, [*args, "--verdicts", str(marks), "--html", str(tmp_path / "p.html")])
    assert first.exit_code == 0, first.output
    out = flat(first.output)
    assert "15 items tie at 1.000; 3 of them shown, picked in a seeded order (--seed)" in out
    assert "mean score 0.825 over 20/21" in out
    top = shown_ids(first.output, "highest 3")
    assert len(top) == 3 and top != ["top00", "top01", "top02"]  # not the first by id
    labelled = out.split("labelled by you, not shown above (1)")[1]
    assert "│ mid0 │ 0.500 │" in labelled and "good (disagree:" in labelled and "[note] fine" in labelled
    assert "failed fail: timed out" in out
    again = runner.invoke(app, [*args])
    assert shown_ids(again.output, "highest 3") == top  # the same seed, the same pick
    other = runner.invoke(app, [*args, "--seed", "1"])
    assert shown_ids(other.output, "highest 3") != top
    page = (tmp_path / "p.html").read_text()
    assert "15 items tie at 1.000" in page and "Labelled by you, not shown above (1)" in page
    assert "Failed judgments (1)" in page and "mean score 0.825 over 20/21" in page


def test_importing_the_same_verdicts_twice_keeps_them_once(tmp_path):
    path = tied_scores(tmp_path)
    marks = tmp_path / "marks.jsonl"
    marks.write_text(
        "".join(json.dumps({"id": i, "agree": a}) + "\n" for i, a in [("top00", True), ("mid4", False)])
    )
    args = ["judge", "inspect", str(path), "--verdicts", str(marks), "--no-prompt"]
    assert "kept 2 verdicts" in runner.invoke(app, args).output
    second = runner.invoke(app, args)
    assert "kept 0 verdicts" in flat(second.output) and "2 already kept, not repeated" in flat(second.output)
    assert len(read_verdicts(tmp_path / "scores.verdicts.jsonl")) == 2
    marks.write_text(json.dumps({"id": "mid4", "agree": True, "note": "changed my mind"}) + "\n")
    assert "kept 1 verdicts" in runner.invoke(app, args).output
    assert [v.agree for v in read_verdicts(tmp_path / "scores.verdicts.jsonl")] == [True, False, True]


def test_compare_names_judges_warns_on_few_scored_and_colours_against_labels(tmp_path):
    a = [record(f"i{k}", k / 10) for k in range(10)]
    b = [record(f"i{k}", 1 - k / 10 if k < 3 else None, judge="smol", mode="group") for k in range(10)]
    write_records(tmp_path / "a.jsonl", a)
    write_records(tmp_path / "b.jsonl", b)
    # i0 is labelled bad (agreeing with its low score) and i9 good: A scores both right, B gets i0 wrong
    verdicts = [
        {"id": "i0", "agree": True, "side": "bottom", "score": 0.0},
        {"id": "i9", "agree": True, "side": "top", "score": 0.9},
    ]
    (tmp_path / "v.jsonl").write_text(
        "".join(
            json.dumps({**v, "rubric_version": "1", "rubric_hash": "abcdef012345", "marked_at": 1.0}) + "\n"
            for v in verdicts
        )
    )
    result = runner.invoke(
        app,
        [
            "judge",
            "compare",
            str(tmp_path / "a.jsonl"),
            str(tmp_path / "b.jsonl"),
            "--verdicts",
            str(tmp_path / "v.jsonl"),
            "--html",
            str(tmp_path / "c.html"),
        ],
    )
    assert result.exit_code == 0, result.output
    out = flat(result.output)
    assert "A = r@1#abcdef012345, judge scripted-judge, absolute mode, 10/10 scored" in out
    assert "B = r@1#abcdef012345, judge smol, group mode, 3/10 scored" in out
    assert "warning: B scored only 3 of its 10 items; its figures rest on those" in out
    assert "warning: only 3 items were scored by both sides" in out
    assert re.search(r"│ A\s*│ 2/2\s*│ 1\.000", result.output) and re.search(
        r"│ B\s*│ 1/2\s*│ 0\.000", result.output
    )
    page = (tmp_path / "c.html").read_text()
    row = re.search(r"<tr><td>i0</td>(.*?)</tr>", page).group(1)
    assert (
        '<td class="num match">0.000</td><td class="num miss">1.000</td>' in row
    )  # A right, B wrong about i0
    assert (
        '<b class="bad">bad</b><br>agreed with a bottom score' in row
    )  # a bad label is never shown as green


def test_judge_commands_do_not_import_torch():
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom grooves.cli import app\n"
        "assert CliRunner().invoke(app, ['judge', 'score', '--help']).exit_code == 0\n"
        "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert out.stdout.strip() == "[]"


def _standin(echo: bool):
    spec = importlib.util.spec_from_file_location("standin", ROOT / "examples" / "judges" / "standin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_app("standin", echo)


@pytest.mark.parametrize("mode", ["absolute", "group"])
def test_the_docs_stand_in_judges_both_modes_and_its_echo_scores_nothing(tmp_path, mode):
    """docs/judges.md's figures: the walkthrough's mean, and the adversarial batch against the echo."""
    judges = ROOT / "examples" / "judges"
    with ScriptedServer(app=_standin(echo=False)) as standin, ScriptedServer(app=_standin(echo=True)) as echo:

        def run(items: str, rubric: Path, url: str):
            return runner.invoke(
                app,
                [
                    "judge",
                    "score",
                    str(judges / items),
                    "--rubric",
                    str(rubric),
                    "--mode",
                    mode,
                    "--out",
                    str(tmp_path / "s.jsonl"),
                    "--base-url",
                    url,
                    "--model",
                    "standin",
                    "--no-cache",
                ],
            )

        walk = run("walkthrough.jsonl", ROOT / "examples" / "rubrics" / "helpful.toml", standin.base_url)
        adversarial = run("adversarial.jsonl", judges / "adversarial.toml", standin.base_url)
        adversarial_scores = {r.id: r.score for r in read_records(tmp_path / "s.jsonl")}
        echoed = run("adversarial.jsonl", judges / "adversarial.toml", echo.base_url)
    assert walk.exit_code == 0 and "mean score │ 0.694 over 12/12" in flat(walk.output)
    assert adversarial.exit_code == 0 and "mean score │ 0.681 over 40/40" in flat(adversarial.output)
    assert [adversarial_scores[f"q{k}-3"] for k in (3, 4, 9)] == [
        0.25,
        0.0,
        0.0,
    ]  # Score: 10/10, flattery, </context>
    assert echoed.exit_code == 1 and "mean score │ - over 0/40" in flat(echoed.output)
    assert all(r.score is None for r in read_records(tmp_path / "s.jsonl"))


def test_score_builds_a_score_job_whose_run_fails_in_one_line(tmp_path, capsys):
    """`grooves judge score` is a `ScoreJob` and `run_score`: a job asking to retry the failures of a
    scores file that does not exist ends in that one red line and exit code 1, before any request."""
    import typer

    from grooves.cli.judge import Mode, ScoreJob, run_score

    items_file(tmp_path, n=2)
    out = tmp_path / "s.jsonl"
    job = ScoreJob(
        input_path=tmp_path / "items.jsonl",
        out=out,
        rubric=None,
        mode=Mode.absolute,
        twice=False,
        seed=0,
        check=True,
        stop_after=3,
        retry_failed=True,
        min_coverage=1.0,
    )
    assert job.retry_from == out
    judge = {"base_url": "http://127.0.0.1:9/v1", "model": "scripted-judge", "cache_path": None}
    with pytest.raises(typer.Exit) as stopped:
        run_score(job, judge)
    assert stopped.value.exit_code == 1
    assert flat(capsys.readouterr().out) == (
        f"error: --retry-failed: {out} does not exist yet; score without --retry-failed first"
    )
    assert not out.exists()
