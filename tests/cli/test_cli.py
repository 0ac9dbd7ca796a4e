"""`grooves train` on a bad run file: one line naming the field, a non-zero exit, no traceback."""

from __future__ import annotations

import shutil

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
