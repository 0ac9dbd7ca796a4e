"""`grooves rubric interview` end to end against judges served over HTTP in the test.

A scripted judge asks its questions and drafts (a malformed draft included); the docs' stand-in
judge interviews and then scores. Checked: the transcript's order and the requests behind it,
the repair, one line and nothing written for each bad input, the refusal to overwrite, typed
answers on a pipe and on a real terminal, `$EDITOR` edits, and that the written rubric scores a
batch through `grooves judge score` and the printed next steps run as printed.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grooves.cli import app
from grooves.config import load_config
from grooves.judge import load_rubric
from grooves.judge.batch import read_records
from grooves.judge.interview import TOPICS
from scripted_judge import Delay, ScriptedServer, Status

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

DRAFT = """```toml
instructions = "Name the capital of the country, in one short sentence."

[[criteria]]
name = "correct capital"
text = "Is the capital right?"
weight = 2
choices = ["no", "yes"]

[[criteria]]
name = "short"
text = "Is it one short sentence?"
choices = ["no", "yes"]

[[criteria]]
name = "no_other_city"
text = "Does it avoid naming any other city?"
choices = ["no", "yes"]
gate = true
```"""

WRITTEN = """name = "capitals"
version = "1"
instructions = "Name the capital of the country, in one short sentence."

[[criteria]]
name = "correct_capital"
text = "Is the capital right?"
weight = 2.0
choices = ["no", "yes"]

[[criteria]]
name = "short"
text = "Is it one short sentence?"
weight = 1.0
choices = ["no", "yes"]

[[criteria]]
name = "no_other_city"
text = "Does it avoid naming any other city?"
weight = 1.0
choices = ["no", "yes"]
gate = true
"""

QUESTIONS = ["What makes an answer great?", "What must an answer never do?", "How do answers usually fail?"]
ANSWERS = ["The right capital, named plainly.", "Name a city that is not the capital.", "They ramble."]


@pytest.fixture(autouse=True)
def hermetic(monkeypatch, tmp_path):
    """No judge settings from the environment; caches and relative outputs under tmp_path."""
    for name in ("GROOVES_JUDGE_BASE_URL", "GROOVES_JUDGE_MODEL", "GROOVES_JUDGE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GROOVES_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)


def flat(text: str) -> str:
    return " ".join(text.split())


def answers_file(tmp_path: Path, answers: list[str] = ANSWERS) -> Path:
    path = tmp_path / "answers.txt"
    path.write_text("".join(a + "\n" for a in answers))
    return path


def interview(server: ScriptedServer | None, *args: str, base_url: str | None = None, **kw):
    url = base_url or (server.base_url if server else None)
    endpoint = ["--base-url", url, "--model", "scripted-judge"] if url else []
    return runner.invoke(app, ["rubric", "interview", *args, *endpoint], **kw)


def test_answers_from_a_file_make_a_rubric_that_loads(tmp_path):
    with ScriptedServer([*QUESTIONS, DRAFT]) as server:
        result = interview(
            server, "capitals", "--answers", str(answers_file(tmp_path)), "--out", "capitals.toml"
        )
    assert result.exit_code == 0, result.output
    out = result.stdout
    # the transcript: each question, then its answer, in order, then the draft and the file
    marks = [f"Q1 {QUESTIONS[0]}", f"A1> {ANSWERS[0]}", f"Q2 {QUESTIONS[1]}", f"A2> {ANSWERS[1]}"]
    marks += [
        f"Q3 {QUESTIONS[2]}",
        f"A3> {ANSWERS[2]}",
        "drafting the rubric from 3 answers",
        "drafted rubric capitals@1#",
    ]
    marks += [WRITTEN.splitlines()[-1], "wrote capitals.toml (capitals@1#"]
    positions = [out.index(m) for m in marks]
    assert positions == sorted(positions)
    assert (tmp_path / "capitals.toml").read_text() == WRITTEN
    rubric = load_rubric(tmp_path / "capitals.toml")
    assert [c.name for c in rubric.criteria] == ["correct_capital", "short", "no_other_city"]
    assert f"wrote capitals.toml ({rubric.tag})" in out
    # three questions (no fourth once the answers ran out), then the draft
    assert len(server.requests) == 4
    draft_request = server.requests[3]["messages"]
    assert [m["content"] for m in draft_request if m["role"] == "assistant"] == QUESTIONS
    answered = [m["content"] for m in draft_request[2:] if m["role"] == "user"]
    assert [a.split("\n\n")[0] for a in answered] == [f"My answer: {a}" for a in ANSWERS]
    assert (
        answered[-1].split("\n\n")[1]
        == "Write the rubric now, from my answers. Reply with TOML only, in exactly this format:"
    )
    assert "capitals: Built-in task `capitals`: name a country's capital" in draft_request[0]["content"]


def test_a_malformed_draft_is_sent_back_once_and_the_repair_is_written(tmp_path):
    malformed = DRAFT.replace("weight = 2", "weight = 0")
    with ScriptedServer([*QUESTIONS[:1], malformed, DRAFT]) as server:
        result = interview(
            server,
            "capitals",
            "--answers",
            str(answers_file(tmp_path, ANSWERS[:1])),
            "--out",
            "capitals.toml",
        )
    assert result.exit_code == 0, result.output
    problem = "the draft: criteria.0.weight: Value error, weight must be > 0, got 0.0; drop the criterion instead of weighting it 0"
    assert f"problem: {problem}" in result.stdout
    assert "(after one repair)" in result.stdout
    assert server.requests[2]["messages"][-1]["content"].startswith(f"That rubric cannot be used: {problem}.")
    assert (tmp_path / "capitals.toml").read_text() == WRITTEN


def test_a_model_that_never_drafts_a_valid_rubric_writes_nothing(tmp_path):
    with ScriptedServer([QUESTIONS[0], "A good answer is short.", "Really, it is short."]) as server:
        result = interview(
            server,
            "capitals",
            "--answers",
            str(answers_file(tmp_path, ANSWERS[:1])),
            "--out",
            "capitals.toml",
        )
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: the judge model scripted-judge did not write a valid rubric, even after one repair (last problem: "
        "the reply holds no TOML (no `key = value` line, no [[criteria]] table); reply with the rubric as TOML); "
        "nothing written"
    )
    assert len(server.requests) == 3 and not (tmp_path / "capitals.toml").exists()
    assert "Traceback" not in result.output


def test_an_existing_rubric_is_never_overwritten_without_consent(tmp_path):
    (tmp_path / "capitals.toml").write_text("# mine\n")
    with ScriptedServer([*QUESTIONS, DRAFT]) as server:
        refused = interview(
            server, "capitals", "--answers", str(answers_file(tmp_path)), "--out", "capitals.toml"
        )
        assert server.requests == []
        replaced = interview(
            server,
            "capitals",
            "--answers",
            str(answers_file(tmp_path)),
            "--out",
            "capitals.toml",
            "--overwrite",
        )
    assert refused.exit_code == 1
    assert refused.stderr.strip() == (
        "error: capitals.toml exists: pass --overwrite to replace it, or --out another file; nothing asked"
    )
    assert replaced.exit_code == 0 and (tmp_path / "capitals.toml").read_text() == WRITTEN


def test_a_rubric_file_that_appears_during_the_interview_is_kept(tmp_path):
    def draft_after_someone_writes(body: dict) -> str:
        (tmp_path / "capitals.toml").write_text("# written meanwhile\n")
        return DRAFT

    with ScriptedServer([QUESTIONS[0], draft_after_someone_writes]) as server:
        result = interview(
            server,
            "capitals",
            "--answers",
            str(answers_file(tmp_path, ANSWERS[:1])),
            "--out",
            "capitals.toml",
        )
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: capitals.toml appeared during the interview; pass --overwrite to replace it, or --out another file"
    )
    assert (tmp_path / "capitals.toml").read_text() == "# written meanwhile\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_no_judge_endpoint_is_one_line_naming_the_settings(tmp_path):
    result = interview(None, "capitals", "--answers", str(answers_file(tmp_path)), "--model", "m")
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: judge base_url is not set: pass --base-url, set judge.base_url, or export "
        "GROOVES_JUDGE_BASE_URL; nothing written"
    )
    assert not (tmp_path / "rubric.toml").exists()


def test_an_endpoint_that_is_down_is_one_line_before_any_question(tmp_path):
    with ScriptedServer() as server:
        down = server.base_url
    result = interview(None, "capitals", "--answers", str(answers_file(tmp_path)), base_url=down)
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"error: cannot reach the judge at {down}/: Connection error. Is the server running?; nothing written"
    )
    assert "Q1" not in result.stdout and not (tmp_path / "rubric.toml").exists()


def test_typed_answers_are_kept_when_the_judge_fails_and_rerun_from_the_file(tmp_path):
    with ScriptedServer([QUESTIONS[0], QUESTIONS[1], Status(400)]) as server:
        failed = interview(
            server, "capitals", "--out", "capitals.toml", input="Paris for France.\nNo other city.\n"
        )
    assert failed.exit_code == 1
    kept = tmp_path / "capitals.answers.txt"
    assert kept.read_text() == "Paris for France.\nNo other city.\n"
    assert failed.stderr.strip().endswith(
        f"; your answers are in {kept.name}: rerun with --answers {kept.name}; nothing written"
    )
    assert not (tmp_path / "capitals.toml").exists()
    with ScriptedServer([QUESTIONS[0], QUESTIONS[1], DRAFT]) as server:
        again = interview(server, "capitals", "--out", "capitals.toml", "--answers", kept.name)
    assert again.exit_code == 0 and (tmp_path / "capitals.toml").read_text() == WRITTEN
    assert "A2> No other city." in again.stdout


def test_bad_arguments_are_one_line_each(tmp_path):
    cases = [
        (["nosuch:Task"], "error: TASK: task 'nosuch:Task': cannot import nosuch"),
        (["capitals", "--run", "runs/none"], "error: --run runs/none: no such run folder"),
        (["capitals", "--batch", "none.jsonl"], "error: --batch none.jsonl: no such file"),
        (["capitals", "--out", "r.txt"], "error: --out r.txt: rubric files are TOML; name it *.toml"),
        (["capitals", "--answers", "none.txt"], "error: --answers none.txt: cannot read it"),
        ([], "error: TASK: say what the task is"),
    ]
    for args, line in cases:
        result = interview(None, *args, base_url="http://127.0.0.1:9/v1")
        assert result.exit_code == 1, (args, result.output)
        assert result.stderr.startswith(line) and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_typed_answers_end_at_done_and_accepting_writes(tmp_path):
    with ScriptedServer([*QUESTIONS, DRAFT]) as server:
        result = interview(
            server,
            "capitals",
            "--out",
            "capitals.toml",
            input="Paris for France.\nNo other city.\ndone\ny\nn\n",
        )
    assert result.exit_code == 0, result.output
    assert "not used" not in result.stdout
    assert len(server.requests) == 4  # three questions, the third answered "done", then the draft
    assert [m["content"] for m in server.requests[3]["messages"] if m["role"] == "assistant"] == QUESTIONS[:2]
    assert 'An empty answer or "done" ends the questions' in result.stdout
    assert (tmp_path / "capitals.toml").read_text() == WRITTEN
    assert "Run steps 1-3 now? [y/n] (y): " in result.stdout  # answered n: nothing more runs
    assert not (tmp_path / "capitals-batch.jsonl").exists()


def test_declining_writes_nothing(tmp_path):
    with ScriptedServer([*QUESTIONS[:2], DRAFT]) as server:
        result = interview(server, "capitals", "--out", "capitals.toml", input="Paris for France.\n\nn\n")
    assert result.exit_code == 0
    assert result.stdout.strip().endswith("not written: nothing changed")
    assert not (tmp_path / "capitals.toml").exists()


def fake_editor(tmp_path: Path, *edits: tuple[str, str]) -> str:
    """An $EDITOR that applies the k-th (old, new) replacement on its k-th call, then appends a comment."""
    script = tmp_path / "editor.py"
    script.write_text(
        "import json, pathlib, sys\n"
        f"edits = json.loads({json.dumps(json.dumps(edits))})\n"
        f"count = pathlib.Path({str(tmp_path / 'editor-calls')!r})\n"
        "k = int(count.read_text()) if count.exists() else 0\n"
        "count.write_text(str(k + 1))\n"
        "path = pathlib.Path(sys.argv[1])\n"
        "old, new = edits[k]\n"
        "path.write_text(path.read_text().replace(old, new) + '# edited\\n')\n"
    )
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


def test_editing_in_the_editor_writes_the_edited_rubric(tmp_path, monkeypatch):
    edits = [("weight = 2.0", "weight = 0.0"), ("weight = 0.0", "weight = 5.0")]  # invalid, then valid
    monkeypatch.setenv("EDITOR", fake_editor(tmp_path, *edits))
    monkeypatch.delenv("VISUAL", raising=False)
    with ScriptedServer([*QUESTIONS[:2], DRAFT]) as server:
        result = interview(server, "capitals", "--out", "capitals.toml", input="Paris.\n\ne\ny\ne\ny\nn\n")
    assert result.exit_code == 0, result.output
    out = flat(result.stdout)
    assert "Please select one of the available options" in out  # "y" is refused while the rubric is invalid
    assert "cannot be written: the edited rubric: criteria.0.weight: Value error, weight must be > 0" in out
    assert "[e/n] (e):" in out  # an invalid rubric cannot be accepted: only edit or quit
    written = (tmp_path / "capitals.toml").read_text()
    assert written == WRITTEN.replace("weight = 2.0", "weight = 5.0") + "# edited\n# edited\n"
    assert load_rubric(tmp_path / "capitals.toml").criteria[0].weight == 5.0


def _standin():
    spec = importlib.util.spec_from_file_location("standin", ROOT / "examples" / "judges" / "standin.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_app("standin", False)


WALKTHROUGH_SCORES = {
    "fr-1": 1.0, "fr-2": 0.5, "fr-3": 0.0, "h2o-1": 1.0, "h2o-2": 0.5, "h2o-3": 0.75,
    "sq-1": 1.0, "sq-2": 0.5, "sq-3": 0.0, "moon-1": 1.0, "moon-2": 0.5, "moon-3": 1.0,
}  # fmt: skip
"""The stand-in's draft on examples/judges/walkthrough.jsonl: (2 correct + direct + answered) / 4, 0 when
`answered` (the gate) is "no": fr-3 only claims to be correct, sq-3 refuses."""


def test_the_written_rubric_scores_a_batch_and_the_next_steps_run_as_printed(tmp_path):
    answers = answers_file(tmp_path, [f"answer {k}" for k in range(6)])
    batch = ROOT / "examples" / "judges" / "walkthrough.jsonl"
    with ScriptedServer(app=_standin()) as standin:
        result = runner.invoke(
            app,
            [
                "rubric",
                "interview",
                "Answer a general-knowledge question in one short sentence",
                "--answers",
                str(answers),
            ]
            + [
                "--batch",
                str(batch),
                "--out",
                "qa.toml",
                "--score-sample",
                "--base-url",
                standin.base_url,
                "--model",
                "standin",
            ],
        )
        assert result.exit_code == 0, result.output
        for k, topic in enumerate(TOPICS, start=1):
            assert f"Q{k} {topic}" in result.stdout
        rubric = load_rubric(tmp_path / "qa.toml")
        assert [(c.name, c.gate) for c in rubric.criteria] == [
            ("correct", False),
            ("direct", False),
            ("answered", True),
        ]
        # the printed score line ran (as a subprocess): its scores are the stand-in's under this rubric
        scores = {r.id: r.score for r in read_records(tmp_path / "qa-scores.jsonl")}
        assert scores == WALKTHROUGH_SCORES
        assert (tmp_path / "qa-inspect.html").is_file()
        # and the printed score line, run here by hand, gives the same
        lines = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("grooves ")]
        assert lines[0] == (
            f"grooves judge score {batch} --rubric qa.toml --out qa-scores.jsonl --mode absolute "
            f"--base-url {standin.base_url} --model standin"
        )
        again = runner.invoke(app, [*shlex.split(lines[0])[1:], "--no-cache"])
        assert again.exit_code == 0 and "mean score │ 0.646 over 12/12" in flat(again.output)
        assert {r.id: r.score for r in read_records(tmp_path / "qa-scores.jsonl")} == WALKTHROUGH_SCORES
    # the run-file line writes a run file that trains with this judge, gated
    config_line = lines[2]
    assert config_line.startswith(
        "grooves config show --set task=your_package.your_module:YourTask --set steps=40"
    )
    argv, into = config_line.split(" > ")
    shown = runner.invoke(app, shlex.split(argv)[1:])
    assert shown.exit_code == 0, shown.output
    Path(into).write_text(shown.stdout)
    config = load_config(into)
    assert (config.steps, config.output_dir, config.judge.rubric, config.judge.model) == (
        40,
        "runs/qa-judged",
        "qa.toml",
        "standin",
    )
    assert config.judge.base_url == standin.base_url
    assert config.judge.gate == 0.125  # half of the lowest total with the gate open: 1 x 1.0 / 4 / 2


def _run_folder(tmp_path: Path, judge_url: str) -> Path:
    """A run folder as `grooves train` leaves one: config.toml with a [judge], and samples of two steps."""
    run = tmp_path / "runs" / "capitals"
    (run / "samples").mkdir(parents=True)
    (run / "config.toml").write_text(
        f'task = "capitals"\noutput_dir = "{run}"\n[model]\nbase_model = "smollm2-135m"\n'
        f'[judge]\nbase_url = "{judge_url}"\nmodel = "standin"\n'
    )
    for step in (1, 2):
        groups = [
            {
                "scenario": {"country": country},
                "trajectories": [
                    {"messages": [{"role": "user", "content": f"What is the capital of {country}?"},
                                  {"role": "assistant", "content": text}]}
                    for text in (
                        "Rome, I think." if step == 1 else f"{capital}.",
                        f"The capital of {country} is {capital}.",
                        "I cannot help with that.",
                    )
                ],
            }
            for country, capital in (("France", "Paris"), ("Peru", "Lima"))
        ]  # fmt: skip
        (run / "samples" / f"step_{step:06d}.jsonl").write_text("".join(json.dumps(g) + "\n" for g in groups))
    return run


def test_a_run_folder_gives_the_task_the_judge_and_the_batch(tmp_path):
    with ScriptedServer(app=_standin()) as standin:
        run = _run_folder(tmp_path, standin.base_url)
        result = runner.invoke(
            app,
            [
                "rubric",
                "interview",
                "--run",
                str(run),
                "--answers",
                str(answers_file(tmp_path)),
                "--out",
                "capitals.toml",
            ]
            + ["--score-sample"],
        )
        assert result.exit_code == 0, result.output
        records = read_records(tmp_path / "capitals-scores.jsonl")
    # the latest samples (step 2) were shown to the interviewer and scored in group mode
    assert {r.mode for r in records} == {"group"} and len(records) == 6
    assert sorted((r.input, r.output, r.score) for r in records) == [
        ("What is the capital of France?", "I cannot help with that.", 0.0),  # the gate
        ("What is the capital of France?", "Paris.", 1.0),  # correct, direct, answered
        ("What is the capital of France?", "The capital of France is Paris.", 1.0),
        ("What is the capital of Peru?", "I cannot help with that.", 0.0),
        ("What is the capital of Peru?", "Lima.", 1.0),
        ("What is the capital of Peru?", "The capital of Peru is Lima.", 1.0),
    ]
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("grooves ")]
    assert lines[2] == (
        f"grooves train {run}/config.toml --set steps=40 --set output_dir=runs/capitals-judged "
        f"--set judge.rubric=capitals.toml --set judge.base_url={standin.base_url} --set judge.model=standin "
        "--set judge.gate=0.125"
    )
    assert lines[3:5] == [
        "grooves eval runs/capitals-judged --split train --scenarios 8 --samples 4 --out capitals-after-batch.jsonl",
        f"grooves judge score capitals-after-batch.jsonl --rubric capitals.toml --out capitals-after-scores.jsonl "
        f"--mode group --base-url {standin.base_url} --model standin",
    ]


def test_a_task_without_a_batch_samples_the_base_model_first(tmp_path):
    with ScriptedServer([QUESTIONS[0], DRAFT]) as server:
        result = interview(
            server, "capitals", "--answers", str(answers_file(tmp_path, ANSWERS[:1])), "--out", "c.toml"
        )
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip().startswith("grooves ")]
    assert lines[:2] == [
        "grooves eval smollm2-135m --task capitals --split train --scenarios 8 --samples 4 --out c-batch.jsonl",
        f"grooves judge score c-batch.jsonl --rubric c.toml --out c-scores.jsonl --mode group "
        f"--base-url {server.base_url} --model scripted-judge",
    ]
    assert "Run steps" not in result.stdout  # --answers: printed, not run


def _read_until(fd: int, pattern: str, seen: list[str], timeout: float = 60.0) -> str:
    """Read the terminal into `seen` until `pattern` matches its text (escape codes removed); that text."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", "".join(seen)).replace("\r", "")
        if re.search(pattern, text, re.DOTALL):
            return text
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                seen.append(os.read(fd, 4096).decode(errors="replace"))
            except OSError:  # the command ended
                break
    raise AssertionError(f"{pattern!r} never appeared; the terminal showed:\n{''.join(seen)}")


def test_on_a_real_terminal_answers_and_the_editor_work(tmp_path):
    """The command in its own process on a pseudo-terminal: prompts, typed answers, $EDITOR, the write."""
    env = dict(os.environ, EDITOR=fake_editor(tmp_path, ("weight = 2.0", "weight = 3.0")), TERM="xterm")
    env.pop("VISUAL", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    with ScriptedServer([*QUESTIONS, DRAFT]) as server:
        leader, follower = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "grooves", "rubric", "interview", "capitals", "--out", "capitals.toml"]
            + ["--base-url", server.base_url, "--model", "scripted-judge"],
            stdin=follower, stdout=follower, stderr=follower, cwd=tmp_path, env=env, close_fds=True,
        )  # fmt: skip
        os.close(follower)
        seen: list[str] = []
        try:
            for k, answer in enumerate(("Paris for France.", "No other city.", "done"), start=1):
                _read_until(leader, rf"Q{k} {re.escape(QUESTIONS[k - 1])}\s+A{k}: ?$", seen)
                os.write(leader, (answer + "\r").encode())
            _read_until(leader, r"drafted rubric capitals@1#.*\[y/e/n\] \(y\): ?$", seen)
            seen.clear()
            os.write(leader, b"e\r")
            _read_until(leader, r"edited rubric capitals@1#.*# edited.*\[y/e/n\] \(y\): ?$", seen)
            os.write(leader, b"y\r")
            text = _read_until(leader, r"Run steps 1-3 now\? \[y/n\] \(y\): ?$", seen)
            os.write(leader, b"n\r")
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(leader)
    assert "wrote capitals.toml (capitals@1#" in text
    assert (tmp_path / "capitals.toml").read_text() == WRITTEN.replace(
        "weight = 2.0", "weight = 3.0"
    ) + "# edited\n"
    assert [m["content"] for m in server.requests[3]["messages"] if m["role"] == "assistant"] == QUESTIONS[:2]


def _own_terminal() -> None:
    """In the child: a session of its own whose controlling terminal is the pty, so Ctrl-C is SIGINT.

    SIGINT is set back to its default: a shell starts background jobs (`make test &`, nohup) with it
    ignored, the child would inherit that, and Python installs no KeyboardInterrupt handler then."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _terminal(
    tmp_path: Path, server: ScriptedServer, env: dict | None = None
) -> tuple[subprocess.Popen, int]:
    """`grooves rubric interview capitals` in its own process on a pseudo-terminal; (process, terminal fd)."""
    env = dict(os.environ, TERM="xterm", **(env or {}))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "grooves", "rubric", "interview", "capitals", "--out", "capitals.toml"]
        + ["--base-url", server.base_url, "--model", "scripted-judge"],
        stdin=follower, stdout=follower, stderr=follower, cwd=tmp_path, env=env, close_fds=True,
        preexec_fn=_own_terminal,
    )  # fmt: skip
    os.close(follower)
    return proc, leader


def test_ctrl_c_at_a_prompt_quits_at_once_with_nothing_written(tmp_path):
    with ScriptedServer([*QUESTIONS, DRAFT]) as server:
        proc, leader = _terminal(tmp_path, server)
        seen: list[str] = []
        try:
            _read_until(leader, r"A1: ?$", seen)
            os.write(leader, b"Paris for France.\r")
            _read_until(leader, r"A2: ?$", seen)
            os.write(leader, b"\x03")  # Ctrl-C, as the terminal sends it
            text = _read_until(leader, r"stopped: nothing written", seen, timeout=20)
            assert proc.wait(timeout=20) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(leader)
    assert "Traceback" not in text
    assert len(server.requests) == 2 and not (tmp_path / "capitals.toml").exists()


def test_ctrl_c_during_a_request_quits_at_once(tmp_path):
    with ScriptedServer([Delay(60, QUESTIONS[0])]) as server:
        proc, leader = _terminal(tmp_path, server)
        seen: list[str] = []
        try:
            _read_until(leader, r"Ctrl-C quits, nothing written\.", seen)
            deadline = time.monotonic() + 10
            while not server.requests and time.monotonic() < deadline:  # the question is being asked
                time.sleep(0.05)
            started = time.monotonic()
            os.write(leader, b"\x03")
            text = _read_until(leader, r"stopped: nothing written", seen, timeout=40)
            assert proc.wait(timeout=20) == 130
            assert time.monotonic() - started < 45  # not after the 60 s reply
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(leader)
    assert "Traceback" not in text and "Q1" not in text


def test_answers_beyond_the_questions_are_named(tmp_path):
    with ScriptedServer([*QUESTIONS[:2], DRAFT]) as server:
        result = interview(
            server,
            "capitals",
            "--answers",
            str(answers_file(tmp_path)),
            "--questions",
            "2",
            "--out",
            "c.toml",
        )
    assert result.exit_code == 0, result.output
    assert (
        f"(1 more answers in {tmp_path / 'answers.txt'} than --questions 2 asks for: not used)"
        in result.stdout
    )
    assert len(server.requests) == 3
