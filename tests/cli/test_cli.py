"""`grooves train` on a bad run file: one line naming the field, a non-zero exit, no traceback."""

from __future__ import annotations

import shutil
import sys

import pytest
from typer.testing import CliRunner

from grooves.cli import app

# each is checked before the model's weights load: a start that fails here writes nothing
BAD = [
    ('task = "no_such_module_xyz:Task"', "task: 'no_such_module_xyz:Task': cannot import no_such_module_xyz"),
    (
        'task = "grooves.tasks.capitals:Nope"',
        "task: 'grooves.tasks.capitals:Nope': cannot import: module grooves.tasks.capitals has no attribute 'Nope'",
    ),
    (
        "[task_options]\nmax_wordz = 4",
        "task_options.max_wordz: 'capitals' has no option 'max_wordz'; its options: validation_fraction, max_words, seed",
    ),
    (
        'tasks = [{task = "capitals"}, {task = "toy_tokens", options = {size = 3}}]',
        "tasks.1.options.size: 'toy_tokens' has no option 'size'",
    ),
    (
        '[lora]\ntarget_modules = ["q_proj", "qproj"]',
        "lora.target_modules: 'qproj' is no layer of this model; its linear layers are down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj",
    ),
    ("[lora]\ntarget_modules = []", "lora.target_modules: List should have at least 1 item"),
    (
        '[model]\ndevice = "gpu"',
        "model.device: not a device; use cpu, cuda, cuda:N, mps, xpu or xpu:N (got 'gpu')",
    ),
    ('[model]\ndevice = "cuda:99"', "model.device: 'cuda:99', but torch sees "),
    (
        '[model]\ntool_format = "xml"',
        "model.tool_format: Input should be 'smollm2' or 'template' (got 'xml')",
    ),
    ("[optim]\nbetas = [0.9, 1.0]", "optim.betas: each beta must be in [0, 1)"),
    ("[optim]\nbetas = [0.9]", "optim.betas.1: Field required"),
    ("seed = -1", "seed: Input should be greater than or equal to 0 (got -1)"),
    ("seed = 4294967296", "seed: Input should be less than or equal to 4294967295 (got 4294967296)"),
    ("steps = true", "steps: Input should be a number, not true (got True)"),
    ('output_dir = ""', "output_dir: is empty; name the run folder, e.g. runs/my_run (got '')"),
    (
        "[rollout]\nmax_tokens = 8192",
        "rollout.max_tokens: 8192 leaves no room for a prompt in the model's context of 8192 tokens",
    ),
    ("[optim]\nlr = inf", "optim.lr: Input should be a finite number (got inf)"),
    ("[lora]\nalpha = nan", "lora.alpha: Input should be a finite number (got nan)"),
    ("[algorithm]\nstd_floor = inf", "algorithm.std_floor: Input should be a finite number (got inf)"),
    ("[watch.reward_jump]\nz = inf", "watch.reward_jump.z: Input should be a finite number (got inf)"),
]


@pytest.fixture(scope="module")
def weightless_model(tiny_model_dir, tmp_path_factory):
    """The tiny model's config and tokenizer without its weights: loading it would fail, so every
    error below is raised before the weights load."""
    out = tmp_path_factory.mktemp("weightless")
    for p in tiny_model_dir.iterdir():
        if p.suffix != ".safetensors":
            shutil.copy(p, out / p.name)
    return out


@pytest.mark.parametrize("body,line", BAD, ids=[b.split("\n")[-1].split("=")[0].strip() for b, _ in BAD])
def test_a_bad_run_file_gives_one_line_naming_the_field(weightless_model, tmp_path, body, line):
    run_file = tmp_path / "bad.toml"
    run_file.write_text(body if "output_dir" in body else f'output_dir = "{tmp_path / "run"}"\n{body}\n')
    result = CliRunner().invoke(
        app, ["train", str(run_file), "--set", f"model.base_model={weightless_model}"]
    )
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"{run_file}: {line}"), result.stderr
    assert not (tmp_path / "run" / "config.toml").exists()


NOT_A_TASK = (
    "not a task: name a Task instance, a class with scenarios(split) and async rollout(model, scenario), "
    "an environment, or a function of yours that returns one"
)
NOT_TASKS = """
import subprocess
from os import system

from numpy import zeros

run = subprocess.run
SETTINGS = {"vocab_size": 487}


class Plain:
    def __init__(self, path=None):
        open(path, "w").close()
"""


@pytest.mark.parametrize(
    "task,options,what",
    [
        ("os:system", 'command = "touch {marker}"', "'os:system': os is Python's standard library"),
        (
            "builtins:exec",
            "source = \"open({marker!r}, 'w')\"",
            "'builtins:exec': builtins is Python's standard library",
        ),
        (
            "not_tasks:system",
            'command = "touch {marker}"',
            "'not_tasks:system' is system from Python's standard library (posix)",
        ),
        (
            "not_tasks:run",
            'args = "touch {marker}"\nshell = true',
            "'not_tasks:run' is run from Python's standard library (subprocess)",
        ),
        ("not_tasks:zeros", "shape = 3", "'not_tasks:zeros' is zeros, a function written in C (numpy)"),
        (
            "not_tasks:Plain",
            'path = "{marker}"',
            "'not_tasks:Plain' is the class Plain, which has no scenarios and no rollout",
        ),
        ("not_tasks:SETTINGS", "", "'not_tasks:SETTINGS' is a dict"),
    ],
)
def test_a_task_that_cannot_be_one_is_refused_before_it_is_called(
    weightless_model, tmp_path, monkeypatch, task, options, what
):
    """A run file is code, but a slip such as `task = "os:system"` must not run its options."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    marker = tmp_path / "ran"
    (tmp_path / "not_tasks.py").write_text(NOT_TASKS)
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        f'task = "{task}"\noutput_dir = "{tmp_path / "run"}"\n[task_options]\n'
        + options.format(marker=str(marker))
        + "\n"
    )
    result = CliRunner().invoke(
        app, ["train", str(run_file), "--set", f"model.base_model={weightless_model}"]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr == f"{run_file}: task: {what}, {NOT_A_TASK}\n"
    assert not marker.exists()  # nothing was called

    option = ["--option", options.format(marker=str(marker))] if options else []
    result = CliRunner().invoke(
        app, ["eval", str(weightless_model), "--task", task, *option]
    )  # the same for eval
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip() == f"grooves eval: --task: {what}, {NOT_A_TASK}"
    assert not marker.exists()


def test_a_run_folder_that_holds_a_run_is_refused_in_one_line(tmp_path):
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'output_dir = "{tmp_path / "run"}"\n')
    (tmp_path / "run" / "checkpoints" / "step_000005").mkdir(parents=True)
    result = CliRunner().invoke(app, ["train", str(run_file)])
    assert result.exit_code == 2 and result.stderr == (
        f"{run_file}: {tmp_path / 'run'} already holds a run (checkpoints up to step_000005); continue it with --resume, "
        "replace it with --overwrite, or set another output_dir\n"
    )
    result = CliRunner().invoke(app, ["train", str(run_file), "--resume", "--overwrite"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "pass one of them" in result.stderr
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".lock", "checkpoints"]


# ---- what a first task written from the docs runs into --------------------------------------------
import re  # noqa: E402
import tomllib  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

TASK_MODULE = """
from grooves.tasks.toy import ToyTokensTask


class BesideTheRunFile(ToyTokensTask):
    name = "beside"
"""


def test_a_task_module_beside_the_run_file_imports_without_pythonpath(
    peaked_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command adds the run file's folder to it
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "beside_task.py").write_text(TASK_MODULE)
    run_file = folder / "run.toml"
    run_file.write_text(
        f'task = "beside_task:BesideTheRunFile"\noutput_dir = "{tmp_path / "run"}"\nsteps = 1\n'
        "[task_options]\nvocab_size = 487\nnum_scenarios = 4\n"
        f'[model]\nbase_model = "{peaked_model_dir}"\n'
        "[rollout]\ngroup_size = 2\ngroups_per_step = 1\nmax_tokens = 2\n"
        "[validation]\nscenarios = 1\n[logging]\nprogress = false\n"
    )
    monkeypatch.chdir(tmp_path)  # not the run file's folder
    result = CliRunner().invoke(app, ["train", str(run_file)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "checkpoints" / "step_000001").is_dir()


def test_a_task_module_that_cannot_be_imported_names_where_python_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'task = "missing_task_xyz:Task"\noutput_dir = "{tmp_path / "run"}"\n')
    result = CliRunner().invoke(app, ["train", str(run_file)])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith(
        f"{run_file}: task: 'missing_task_xyz:Task': cannot import missing_task_xyz: No module named 'missing_task_xyz'; "
        f"Python looked in the run file's folder ({tmp_path}), the running script's folder, PYTHONPATH"
    )
    assert "put the module beside the run file, add its folder to PYTHONPATH, or pip install its package" in (
        result.stderr
    )


def test_resume_without_a_checkpoint_is_one_line_before_the_model_loads(tmp_path):
    """The model named does not exist: the --resume check must come first to be what is reported."""
    missing = tmp_path / "no-model-here"
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'output_dir = "{tmp_path / "run"}"\n[model]\nbase_model = "{missing}"\n')
    result = CliRunner().invoke(app, ["train", str(run_file), "--resume"])
    assert result.exit_code == 2 and result.stderr == (
        f"{run_file}: --resume: no checkpoint in {tmp_path / 'run' / 'checkpoints'}; start without --resume\n"
    )
    data = tmp_path / "chats.jsonl"
    data.write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]}\n'
    )
    result = CliRunner().invoke(
        app, ["sft", "--data", str(data), "--model", str(missing), "-o", str(tmp_path / "sft"), "--resume"]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip() == (
        f"error: --resume: no checkpoint in {tmp_path / 'sft' / 'checkpoints'}; start without --resume"
    )


def _documented_run_file() -> str:
    text = (ROOT / "docs" / "training.md").read_text()
    start = text.index("One TOML file describes a run")
    return re.search(r"```toml\n(.*?)```", text[start:], re.S).group(1)


def test_the_documented_run_file_is_valid_toml_and_a_valid_run_file_as_printed():
    from grooves.config import parse_config

    data = tomllib.loads(_documented_run_file())
    config = parse_config(data)
    assert config.task == "mypkg.titles:Titles" and config.rollout.groups_per_step == 4
    assert config.algorithm.kl_kind == "k3" and config.optim.on_nonfinite == "skip"


def test_models_list_keeps_a_long_path_whole(tmp_path, monkeypatch):
    home = tmp_path / ("a-folder-name-long-enough-to-pass-eighty-columns-" * 2)
    monkeypatch.setenv("GROOVES_HOME", str(home))
    result = CliRunner().invoke(app, ["models", "list"])  # not a terminal: rich would assume 80 columns
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if "smollm2-135m" in line)
    assert str(home / "models" / "SmolLM2-135M-Instruct") in row
    assert "not fetched (grooves models fetch)" in row
