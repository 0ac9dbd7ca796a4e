"""Your own environment, named `module:object`: every `grooves env` command takes it, a task setting
takes it, and what cannot be used (not an environment, a scenario without a prompt, a grader that
raises, a gold solver that never reaches 1.0) is one line naming the object and what is wrong."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grooves.cli import app
from grooves.envs import EnvSpec, SqliteEnvironment, load_env
from grooves.envs.registry import EnvLoadError
from grooves.tasks import TaskLoadError, load_task
from grooves.tasks.environment import EnvironmentTask

ROOT = Path(__file__).resolve().parents[2]

DESK = textwrap.dedent(
    """
    from grooves.envs import EnvSpec, Grade, SqliteEnvironment, Tool, ToolError, assign_splits, obj, string

    def build_seed(conn, seed):
        conn.execute("CREATE TABLE notes (text TEXT)")

    def make_scenarios(conn, seed):
        words = ["alpha", "beta", "gamma", "delta", "epsilon"]
        return assign_splits("tiny_desk", [{"prompt": f"Save {w}.", "expected": w} for w in words])

    def save(ctx, args):
        if not args["text"]:
            raise ToolError("a note needs some text")
        ctx.state.execute("INSERT INTO notes VALUES (?)", (args["text"],))
        return {"saved": args["text"]}

    def grade(g):
        saved = [r["text"] for r in g.state.query("SELECT text FROM notes")]
        return Grade(score=1.0 if saved == [g.scenario["expected"]] else 0.0)

    def gold(scenario, call):
        refused = call("save", {"text": ""})
        assert refused["error"] == "refused", refused  # a refusal comes back as the error the agent reads
        call("save", {"text": scenario["expected"]})
        return "Saved."

    def save_twice(scenario, call):
        call("save", {"text": scenario["expected"]})
        call("save", {"text": scenario["expected"]})
        return "Saved."

    TOOLS = [Tool("save", "Save a note.", obj({"text": string("the note")}, ["text"]), save)]
    SPEC = EnvSpec("tiny_desk", "save notes", "You save notes.", build_seed, make_scenarios, TOOLS, grade, gold,
                   lambda scenario: [save_twice])

    def make_env():
        return SqliteEnvironment(SPEC)

    NOT_AN_ENV = {"name": "tiny_desk"}

    def make_nothing():
        return 42

    def broken_factory():
        raise RuntimeError("the data file is missing")

    def no_prompt(conn, seed):
        return assign_splits("tiny_desk", [{"text": "no prompt here"}])

    def raising_grade(g):
        return {"tiny_desk-000": 1.0}[g.scenario["id"]]

    def half(scenario, call):
        call("save", {"text": scenario["expected"] + "!"})
        return "Saved."

    import dataclasses
    NO_PROMPT = dataclasses.replace(SPEC, make_scenarios=no_prompt)
    RAISING_GRADER = dataclasses.replace(SPEC, grade=raising_grade)
    NEVER_GOLD = dataclasses.replace(SPEC, gold=half)
    """
)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A folder holding `tiny_desk.py`, the working folder of the commands."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "tiny_desk.py").write_text(DESK)
    monkeypatch.chdir(tmp_path)
    sys.path.append(str(tmp_path))  # for load_task and load_env called here; the commands add it first
    sys.modules.pop("tiny_desk", None)
    yield tmp_path
    sys.modules.pop("tiny_desk", None)


def _run(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("name", ["tiny_desk:SPEC", "tiny_desk:make_env", "tiny_desk:SqliteEnvironment"])
def test_every_env_command_takes_module_object(project, name):
    if name.endswith("SqliteEnvironment"):  # a class that needs arguments: its own error, one line
        result = _run("env", "validate", name)
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
        assert result.stderr.startswith(
            "grooves env validate: environment 'tiny_desk:SqliteEnvironment': calling SqliteEnvironment() "
            "raised TypeError:"
        )
        return
    checked = _run("env", "validate", name)
    assert checked.exit_code == 0, checked.output
    assert checked.stdout.splitlines() == [
        "tiny_desk: 5 scenarios, min gold 1.000, max bad 0.000 (threshold 0.5): ok",
        "  gold solver gold: 1.0 on 5 of 5 scenarios (it must score 1.0 on every one)",
        "  bad solvers, each must score <= 0.5 on every scenario:",
        "    empty answer: max 0.000 over 5",
        "    echo of the prompt: max 0.000 over 5",
        "    save_twice: max 0.000 over 5",
    ]
    shown = _run("env", "scenarios", name, "--split", "train")
    assert [json.loads(line)["prompt"] for line in shown.stdout.splitlines()] == [
        "Save alpha.",
        "Save beta.",
        "Save gamma.",
        "Save delta.",
    ]
    demos = _run("env", "demos", name, "--out", "demos.jsonl")
    assert demos.exit_code == 0 and "4 demonstrations from 4 train scenarios" in demos.stdout, demos.output
    chat = json.loads((project / "demos.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in chat["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert json.loads(chat["messages"][3]["content"]) == {
        "error": "refused",
        "message": "a note needs some text",
    }


def test_the_env_help_shows_the_module_object_form():
    result = _run("env", "--help")
    assert result.exit_code == 0 and "module:object" in result.stdout
    result = _run("env", "validate", "--help")
    assert "module:object" in result.stdout and "EnvSpec" in result.stdout


NOT_AN_ENV = "name an EnvSpec, an Environment (SqliteEnvironment, McpEnvironment, ...), or a function of yours that returns one"


@pytest.mark.parametrize(
    "name,line",
    [
        (
            "tiny_desk:NOT_AN_ENV",
            f"environment 'tiny_desk:NOT_AN_ENV' is a dict, not an environment: {NOT_AN_ENV}",
        ),
        (
            "tiny_desk:make_nothing",
            f"environment 'tiny_desk:make_nothing': make_nothing() returned a int, not an environment: {NOT_AN_ENV}",
        ),
        (
            "tiny_desk:broken_factory",
            "environment 'tiny_desk:broken_factory': calling broken_factory() raised RuntimeError: "
            "the data file is missing",
        ),
        (
            "tiny_desk:NO_PROMPT",
            "environment 'tiny_desk:NO_PROMPT': ValueError: tiny_desk: make_scenarios: scenario 0 ('tiny_desk-000') "
            "has no 'prompt'; each scenario needs a string id, a split (train, validation or test) and a string "
            "prompt (assign_splits adds id, env and split)",
        ),
        (
            "tiny_desk:nothing",
            "environment 'tiny_desk:nothing': cannot import: module tiny_desk has no attribute 'nothing'",
        ),
        (
            "os:getcwd",
            f"environment 'os:getcwd': os is Python's standard library, not an environment: {NOT_AN_ENV}",
        ),
        (
            "no_such_env_module:SPEC",
            "environment 'no_such_env_module:SPEC': cannot import no_such_env_module: ",
        ),
        (
            "library_desk",
            "environment 'library_desk' is not built in (support_desk, issue_tracker, flight_booking, ",
        ),
    ],
)
def test_what_is_not_an_environment_is_one_line_naming_it(project, name, line):
    for command in (["validate"], ["scenarios"], ["demos", "--out", "x.jsonl"], ["serve"]):
        result = _run("env", command[0], name, *command[1:])
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output and result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"grooves env {command[0]}: {line}"), result.stderr
    assert not (project / "x.jsonl").exists()
    with pytest.raises(EnvLoadError) as caught:
        load_env(name)
    assert str(caught.value).startswith(line)


def test_a_working_folder_import_failure_says_where_python_looked(project):
    result = _run("env", "validate", "no_such_env_module:SPEC")
    assert f"Python looked in the working folder ({project}), the running script's folder" in result.stderr
    assert "put the module in the working folder" in result.stderr


def test_a_grader_that_raises_and_a_gold_solver_below_one_are_named(project):
    result = _run("env", "validate", "tiny_desk:RAISING_GRADER")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "tiny_desk: 5 scenarios, min gold 0.000, max bad 1.000 (threshold 0.5): 19 failures"
    assert (
        "  tiny_desk-001: tiny_desk: grader raising_grade raised KeyError: 'tiny_desk-001' (scenario "
        "'tiny_desk-001'), on the chat of the gold solver gold"
    ) in lines
    assert (
        "  tiny_desk-000: bad solver empty answer scored 1.000, above 0.5" in lines
    )  # this grader credits anything there

    result = _run("env", "validate", "tiny_desk:NEVER_GOLD")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[:2] == [
        "tiny_desk: 5 scenarios, min gold 0.000, max bad 0.000 (threshold 0.5): 5 failures",
        "  gold solver half: 1.0 on 0 of 5 scenarios (it must score 1.0 on every one)",
    ]
    assert "  tiny_desk-000: gold solver half scored 0.000, not 1.0" in result.stdout.splitlines()
    demos = _run("env", "demos", "tiny_desk:NEVER_GOLD", "--out", "demos.jsonl")
    assert demos.exit_code == 1 and demos.stderr.count("\n") == 1
    assert demos.stderr == (
        "grooves env demos: tiny_desk: 0 demonstrations from 4 train scenarios; dropped 4 scoring below 1.0, "
        "skipped 0 whose gold solver failed; wrote nothing (first: tiny_desk-000: scored 0.000): grooves env "
        "validate tiny_desk:NEVER_GOLD shows what the gold solver misses\n"
    )
    assert not (project / "demos.jsonl").exists()


def test_a_raising_grader_fails_the_rollout_with_a_line_naming_it(project):
    import asyncio

    from test_envs_rollout import ScriptedClient

    from grooves.envs import make_rollout
    from grooves.rollouts.gather import gather

    env = load_env("tiny_desk:RAISING_GRADER")
    client = ScriptedClient(lambda messages: ("Saved.", []))
    rollout = make_rollout(env, model="m")
    groups = asyncio.run(
        gather(rollout, client, env.scenarios("validation"), 1, progress=False, max_failure_fraction=1.0)
    )
    assert groups[0].trajectories[0].error == (
        "grooves.envs.base.GraderError: tiny_desk: grader raising_grade raised KeyError: 'tiny_desk-004' "
        "(scenario 'tiny_desk-004')"
    )


def test_an_environment_is_accepted_where_a_task_is(project):
    for name in ("tiny_desk:SPEC", "tiny_desk:make_env"):
        task = load_task(name)
        assert isinstance(task, EnvironmentTask) and task.name == "env:tiny_desk"
        assert (task.max_turns, task.success_threshold) == (None, 1.0)  # the documented defaults
    task = load_task("env:tiny_desk:SPEC", {"max_turns": 3, "success_threshold": 0.5, "seed": 2})
    assert (task.max_turns, task.success_threshold, task.env.data_seed) == (3, 0.5, 2)
    with pytest.raises(
        TaskLoadError,
        match=r"^task 'env:tiny_desk:make_env': environment 'tiny_desk:make_env' "
        r"is built already, with its own data; a data seed \(2\) applies to a built-in or an EnvSpec$",
    ):
        load_task("env:tiny_desk:make_env", {"seed": 2})
    with pytest.raises(
        TaskLoadError,
        match=r"^task 'tiny_desk:SPEC' is an instance, which takes no options; for the "
        r"environment's options write task = \"env:tiny_desk:SPEC\"$",
    ):
        load_task("tiny_desk:SPEC", {"max_turns": 3})
    with pytest.raises(TaskLoadError, match=r"^task 'env:nosuch': environment 'nosuch' is not built in"):
        load_task("env:nosuch")
    with pytest.raises(ValueError, match=r"success_threshold must be in \(0, 1\]"):
        EnvironmentTask("tiny_desk:SPEC", success_threshold=0.0)


def test_the_validation_report_prints_as_its_summary():
    from grooves.envs import get_env

    report = get_env("corpus_search").validate(splits=("validation",))
    assert repr(report) == str(report) == report.summary()
    assert len(repr(report)) < 600  # not ~400 floats
    assert list(report.bad_solvers) == [
        "empty answer",
        "echo of the prompt",
        "cite_only",
        "hedge",
        "look_alike",
    ]
    assert all(len(scores) == 20 for scores in report.bad_solvers.values())


def test_the_example_environment_validates_and_builds_from_its_spec():
    sys.path.insert(0, str(ROOT / "examples" / "envs"))
    try:
        import library_desk

        env = SqliteEnvironment(library_desk.SPEC)
        assert isinstance(library_desk.SPEC, EnvSpec)
        assert (len(env.scenarios("train")), len(env.scenarios("validation"))) == (60, 20)
        report = env.validate()
        assert report.ok and report.gold_solver == "gold", report
        assert sorted(report.bad_solvers) == [
            "claim_without_acting",
            "echo of the prompt",
            "empty answer",
            "lend_over_the_limit",
        ]
    finally:
        sys.path.remove(str(ROOT / "examples" / "envs"))
