"""Run files: one-line errors that name the field; the resolved config round-trips."""

from __future__ import annotations

import pytest

from grooves.config import ConfigError, dump_config, load_config, parse_config


def _error(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return str(info.value)


def test_unknown_field_is_named():
    msg = _error({"rollout": {"group_sise": 4}})
    assert msg == "rollout.group_sise: unknown field; check its spelling and section"


def test_wrong_type_is_named():
    msg = _error({"optim": {"lr": "fast"}})
    assert msg.startswith("optim.lr: ") and "'fast'" in msg and "\n" not in msg


@pytest.mark.parametrize(
    "data,field",
    [
        ({"rollout": {"group_size": 1}}, "rollout.group_size"),
        ({"optim": {"lr": 0}}, "optim.lr"),
        ({"optim": {"lr": -1e-5}}, "optim.lr"),
        ({"steps": 0}, "steps"),
        ({"lora": {"rank": 0}}, "lora.rank"),
    ],
)
def test_impossible_values(data, field):
    msg = _error(data)
    assert msg.startswith(f"{field}: ") and "\n" not in msg


def test_an_unknown_fast_mode_names_the_field_and_the_choices():
    msg = _error({"model": {"fast": "fastest"}})
    assert (
        msg.startswith("model.fast: ")
        and all(f"'{m}'" in msg for m in ("on", "timed", "off"))
        and "\n" not in msg
    )


@pytest.mark.parametrize(
    "key", ["merge_lora_for_sampling", "fused_decode", "matmul_forms", "reuse_freed_memory"]
)
def test_a_retired_speed_setting_names_its_replacement(key):
    msg = _error({"model": {key: False}})
    assert (
        msg.startswith(f"model.{key}: replaced by model.fast (")
        and msg.endswith("see docs/speed.md")
        and "\n" not in msg
    )


@pytest.mark.parametrize(
    "old,new",
    [
        ("logging.checkpoint_every", "checkpoint.every"),
        ("logging.keep_checkpoints", "checkpoint.keep"),
        ("logging.keep_best_by", "checkpoint.keep_best_by"),
        ("logging.keep_best_mode", "checkpoint.keep_best_mode"),
        ("rollout.ray_address", "ray.address"),
        ("rollout.ray_workers", "ray.workers"),
        ("rollout.server_host", "ray.server_host"),
    ],
)
def test_a_moved_field_says_where_it_went_in_both_run_files(tmp_path, old, new):
    """Checkpoint policy left [logging] for [checkpoint], Ray's deployment left [rollout] for [ray]."""
    from grooves.config import load_sft_config

    section, key = old.split(".")
    table, field = new.split(".")
    line = f"{old}: moved to {new}: set it as `{field}` in the [{table}] table"
    path = tmp_path / "run.toml"
    path.write_text(f"[{section}]\n{key} = 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == line
    if section == "logging":  # grooves sft reads the same [logging] and [checkpoint]
        path.write_text(f'data = "chats.jsonl"\n[{section}]\n{key} = 2\n')
        with pytest.raises(ConfigError) as err:
            load_sft_config(path)
        assert str(err.value) == line
    with pytest.raises(ConfigError) as err:  # a --set of the old name too
        load_config(None, {old: 2})
    assert str(err.value) == line


def test_the_moved_fields_are_read_from_their_new_sections():
    config = parse_config(
        {
            "checkpoint": {"every": 5, "keep": 2, "keep_best_by": "val/reward_mean", "keep_best_mode": "min"},
            "ray": {"address": "auto", "workers": 4, "server_host": "0.0.0.0"},
            "rollout": {"runner": "ray"},
        }
    )
    c, r = config.checkpoint, config.ray
    assert (c.every, c.keep, c.keep_best_by, c.keep_best_mode) == (5, 2, "val/reward_mean", "min")
    assert (r.address, r.workers, r.server_host, config.rollout.runner) == ("auto", 4, "0.0.0.0", "ray")
    default = parse_config({})
    assert (default.checkpoint.every, default.checkpoint.keep, default.ray.workers) == (1, 3, 2)


def test_sft_and_rl_share_their_sections_and_the_learning_rate_is_declared_once():
    from grooves.config import (
        AdamWConfig,
        CheckpointConfig,
        LoggingConfig,
        OptimConfig,
        RunLoggingConfig,
        SftConfig,
        ValidationConfig,
    )

    sft, rl = SftConfig.model_fields, parse_config({}).__class__.model_fields
    for name, cls in [
        ("validation", ValidationConfig),
        ("checkpoint", CheckpointConfig),
        ("optim", AdamWConfig),
    ]:
        assert sft[name].annotation is cls
    assert rl["validation"].annotation is ValidationConfig and rl["checkpoint"].annotation is CheckpointConfig
    assert sft["logging"].annotation is LoggingConfig and issubclass(RunLoggingConfig, LoggingConfig)
    assert issubclass(OptimConfig, AdamWConfig) and "lr" not in vars(OptimConfig).get("__annotations__", {})
    assert AdamWConfig().lr == OptimConfig().lr == 2e-4


def test_sft_keeps_its_own_defaults_for_fields_a_table_leaves_out():
    """A [validation] or [checkpoint] table in an SFT file sets its fields over grooves sft's defaults
    (validation only at both ends, 64-token turns, a checkpoint every 10 steps), not grooves train's."""
    from grooves.config import parse_sft_config

    config = parse_sft_config(
        {"data": "c.jsonl", "task": "capitals", "validation": {"scenarios": 5}, "checkpoint": {"keep": 2}}
    )
    v, c = config.validation, config.checkpoint
    assert (config.task, v.scenarios, v.every, v.max_tokens, v.samples) == ("capitals", 5, 0, 64, 1)
    assert (c.every, c.keep) == (10, 2)
    bare = parse_sft_config({"data": "c.jsonl"})
    assert (bare.task, bare.validation.every, bare.checkpoint.every) == (None, 0, 10)
    rl = parse_config({"validation": {"scenarios": 5}})
    assert (rl.validation.every, rl.validation.max_tokens, rl.checkpoint.every) == (10, None, 1)


@pytest.mark.parametrize("key", ["task", "task_options"])
def test_sft_validation_task_moved_to_the_top_level(key):
    from grooves.config import parse_sft_config

    with pytest.raises(ConfigError) as err:
        parse_sft_config({"data": "c.jsonl", "validation": {key: "capitals" if key == "task" else {}}})
    assert str(err.value).startswith(f"validation.{key}: moved to the top level: {key} = ")
    assert "\n" not in str(err.value)


def test_load_and_round_trip(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('name = "x"\nsteps = 3\n[rollout]\ngroup_size = 4\n[algorithm]\nloss = "cispo"\n')
    config = load_config(path)
    assert (config.steps, config.rollout.group_size, config.algorithm.loss) == (3, 4, "cispo")
    path.write_text(dump_config(config))
    assert load_config(path) == config


def test_bad_toml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="no such run file"):
        load_config(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    "text,line",
    [
        ("[optim]\nlr = inf", "optim.lr: Input should be a finite number (got inf)"),
        ("[optim]\nbetas = [0.9, nan]", "optim.betas.1: Input should be a finite number (got nan)"),
        ("[lora]\nalpha = -inf", "lora.alpha: Input should be a finite number (got -inf)"),
        ("[algorithm]\nstd_floor = inf", "algorithm.std_floor: Input should be a finite number (got inf)"),
        ("[rollout]\ntemperature = nan", "rollout.temperature: Input should be a finite number (got nan)"),
        (
            "[watch.reward_jump]\nmin_delta = inf",
            "watch.reward_jump.min_delta: Input should be a finite number (got inf)",
        ),
        ("[task_options]\nscale = inf", "task_options.scale: Input should be a finite number (got inf)"),
        (
            'tasks = [{task = "capitals", weight = inf}]',
            "tasks.0.weight: Input should be a finite number (got inf)",
        ),
        (
            "[rollout]\nconcurrency = true",
            "rollout.concurrency: Input should be a number, not true (got True)",
        ),
        (
            "[optim]\nweight_decay = false",
            "optim.weight_decay: Input should be a number, not false (got False)",
        ),
    ],
)
def test_every_number_must_be_finite_and_a_number(tmp_path, text, line):
    """One check over the whole validated config, the watch's sections and task options included."""
    path = tmp_path / "run.toml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == line


def test_the_tool_formats_the_config_allows_are_the_ones_that_exist():
    from typing import get_args

    from grooves.config import ToolFormats
    from grooves.policy.tool_format import TOOL_FORMATS

    assert sorted(get_args(ToolFormats)) == sorted(TOOL_FORMATS)


def test_a_learning_rate_past_1_is_refused_in_rl_and_sft_run_files():
    from grooves.config import parse_sft_config

    expected = (
        "optim.lr: must be at most 1 (AdamW moves each weight by about lr a step; "
        "LoRA learns at 1e-5..1e-3) (got 1e+30)"
    )
    assert _error({"optim": {"lr": 1e30}}) == expected
    with pytest.raises(ConfigError) as info:
        parse_sft_config({"data": "chats.jsonl", "optim": {"lr": 1e30}})
    assert str(info.value) == expected
    assert parse_config({"optim": {"lr": 1.0}}).optim.lr == 1.0  # the bound itself is allowed


def test_a_check_across_fields_is_one_line_without_the_input():
    assert (
        _error({"tasks": []}) == "tasks is empty; list at least one {task = ..., weight = ...} or use `task`"
    )


def test_an_sft_run_file_is_checked_like_a_training_run_file():
    """One config system: SFT's sections refuse what RL's refuse, with the same lines."""
    from grooves.config import parse_sft_config

    cases = {
        "optim.lr: Input should be a finite number": {"optim": {"lr": float("inf")}},
        "model.fused_decode: replaced by model.fast": {"model": {"fused_decode": True}},
        "task_options.k: Input should be a finite number": {"task_options": {"k": float("nan")}},
    }
    for start, extra in cases.items():
        with pytest.raises(ConfigError) as err:
            parse_sft_config({"data": "chats.jsonl", **extra})
        assert str(err.value).startswith(start) and "\n" not in str(err.value), str(err.value)
    with pytest.raises(ConfigError, match=r"^optim\.betas: each beta must be in \[0, 1\)"):
        parse_sft_config({"data": "chats.jsonl", "optim": {"betas": [0.9, 1.0]}})
    config = parse_sft_config({"data": "chats.jsonl"})
    assert (config.optim.lr, config.checkpoint.every) == (2e-4, 10)  # SFT's own defaults
