"""The [sft] stage of an RL run file: SFT on demonstrations, then RL from that adapter, in one run."""

from __future__ import annotations

import json

import pytest
import tomli_w
from safetensors.torch import load_file
from typer.testing import CliRunner

from grooves.cli import app as cli_app
from grooves.config import ConfigError, parse_config
from grooves.envs import get_env
from grooves.envs.demos import demonstrations
from grooves.tasks.capitals import CapitalsTask
from grooves.training.loop import train
from grooves.training.runlog import RunFolderError
from grooves.training.sft import held_out, validation_overlap

TOOLS = [
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
]


def _chat(prompt: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}


def _write(path, chats) -> str:
    path.write_text("".join(json.dumps(c) + "\n" for c in chats))
    return str(path)


def _data(model_dir, out, demos, **over) -> dict:
    data = {
        "name": "staged",
        "output_dir": str(out),
        "seed": 1,
        "steps": 1,
        "task": "toy_tokens",
        "task_options": {"vocab_size": 487, "num_scenarios": 16},
        "model": {"base_model": str(model_dir)},
        "lora": {"rank": 4, "alpha": 8},
        "rollout": {"group_size": 2, "groups_per_step": 1, "max_tokens": 4},
        "optim": {"lr": 1e-12},  # RL barely moves: its adapter stays the SFT stage's
        "validation": {"every": 0, "scenarios": 1, "samples": 1},
        "logging": {"progress": False, "report": False},
        "sft": {"data": demos, "batch_size": 2, "steps": 3, "lr": 5e-2, "checkpoint_every": 1},
    }
    data.update(over)
    return data


def _lora(folder):
    return load_file(str(folder / "adapter" / "adapter_model.safetensors"))


def test_the_run_trains_on_the_demonstrations_then_starts_rl_from_that_adapter(tiny_model_dir, tmp_path):
    demos = _write(
        tmp_path / "demos.jsonl", [_chat(f"Write something, number {i}.", "yes no") for i in range(4)]
    )
    run_dir = train(parse_config(_data(tiny_model_dir, tmp_path / "run", demos)))
    sft_rows = [json.loads(line) for line in (run_dir / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in sft_rows] == [1, 2, 3] and sft_rows[-1]["loss"] < sft_rows[0]["loss"]
    assert parse_config_toml(run_dir)["model"]["init_adapter"] == str(run_dir / "sft")
    sft_weights = _lora(run_dir / "sft" / "checkpoints" / "step_000003")
    rl_weights = _lora(run_dir / "checkpoints" / "step_000001")
    assert sft_weights.keys() == rl_weights.keys()
    assert any(float(w.abs().max()) > 1e-3 for k, w in sft_weights.items() if "lora_B" in k)  # SFT trained
    for key, w in sft_weights.items():
        assert (rl_weights[key] - w).abs().max() < 1e-6, key
    # run again: the folder holds the run (and its stage); --resume continues RL and skips the stage
    with pytest.raises(RunFolderError, match="already holds a run"):
        train(parse_config(_data(tiny_model_dir, tmp_path / "run", demos)))
    data = _data(tiny_model_dir, tmp_path / "run", demos, steps=2)
    train(parse_config(data), resume=True)
    assert len((run_dir / "sft" / "metrics.jsonl").read_text().splitlines()) == 3  # not trained again


def parse_config_toml(run_dir):
    import tomllib

    return tomllib.loads((run_dir / "config.toml").read_text())


def test_a_demonstration_of_a_validation_scenario_is_refused(tiny_model_dir, tmp_path):
    # toy_tokens: numbers 0-7 are train, 8-15 validation
    demos = _write(
        tmp_path / "demos.jsonl",
        [_chat("Write something, number 1.", "yes"), _chat("Write something, number 9.", "no")],
    )
    with pytest.raises(ConfigError) as err:
        train(parse_config(_data(tiny_model_dir, tmp_path / "run", demos)))
    assert str(err.value) == (
        f"sft.data: {demos} line 2: demonstrates validation scenario 'Write something, number 9.'; "
        "demonstrations come from the train split (grooves env demos NAME --split train)"
    )
    assert not (tmp_path / "run" / "sft").exists()  # refused before anything trained


def test_environment_demonstrations_never_overlap_its_validation_scenarios():
    env = get_env("corpus_search")
    chats = [{**c, "line": i} for i, c in enumerate(demonstrations(env, "train"), start=1)]
    validation = env.scenarios("validation")
    assert len(chats) == len(env.scenarios("train")) and validation_overlap(chats, validation) is None
    chats[4]["scenario_id"] = validation[0]["id"]  # a demonstration recorded against a validation id
    assert (
        validation_overlap(chats, validation)
        == f"line 5: demonstrates validation scenario {validation[0]['id']!r}"
    )


def test_an_sft_stage_refuses_demonstrations_of_the_test_split(tmp_path):
    from grooves.tasks.environment import EnvironmentTask

    task = EnvironmentTask("corpus_search")
    held = held_out(task)
    assert len(held) == 120  # 20 validation and 100 test scenarios
    test = task.scenarios("test")
    chat = {"line": 3, "messages": [{"role": "user", "content": test[7]["prompt"]}]}
    assert validation_overlap([chat], held) == f"line 3: demonstrates test scenario {test[7]['id']!r}"
    assert len(held_out(CapitalsTask())) == len(CapitalsTask().scenarios("validation"))  # no test split


def test_a_bad_demonstration_is_one_line_naming_the_file_line_and_turn(tiny_model_dir, tmp_path):
    call = {"id": "c1", "type": "function", "function": {"name": "delete_all", "arguments": "{}"}}
    bad = {
        "messages": [
            {"role": "user", "content": "Write something, number 2."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
            {"role": "assistant", "content": "ok"},
        ],
        "tools": TOOLS,
    }
    demos = _write(tmp_path / "demos.jsonl", [_chat("Write something, number 1.", "yes"), bad])
    run_file = tmp_path / "run.toml"
    run_file.write_text(tomli_w.dumps(_data(tiny_model_dir, tmp_path / "run", demos)))
    result = CliRunner().invoke(cli_app, ["train", str(run_file)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[-1] == (
        f"{run_file}: sft.data: {demos}:2: assistant turn 1 (message 1): calls 'delete_all', "
        "which is not one of the chat's tools (lookup)"
    ), result.output
    assert "Traceback" not in result.output
