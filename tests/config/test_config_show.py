"""`grooves config show`: the resolved run file, every field under its one-line doc, loading back to the same config."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import get_origin

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from grooves.cli import app as cli_app
from grooves.config import RunConfig, SftConfig, load_config, load_sft_config, parse_config, parse_sft_config

ROOT = Path(__file__).resolve().parents[2]


def _fields(model: type[BaseModel], path: str = ""):
    """(dotted name, field info) of every leaf field, through nested and optional sections."""
    for name, info in model.model_fields.items():
        subs = [
            a
            for a in (*getattr(info.annotation, "__args__", ()), info.annotation)
            if isinstance(a, type) and get_origin(a) is None and issubclass(a, BaseModel)
        ]
        if subs:
            yield from _fields(subs[0], f"{path}{name}.")
        else:
            yield f"{path}{name}", info


@pytest.mark.parametrize("model", [RunConfig, SftConfig])
def test_every_field_has_a_doc(model):
    assert [name for name, info in _fields(model) if not info.description] == []


def test_show_prints_every_default_under_its_doc_and_loads_back(tmp_path):
    run_file = ROOT / "examples" / "agents" / "corpus_search.toml"
    result = CliRunner().invoke(cli_app, ["config", "show", str(run_file), "--set", "rollout.group_size=6"])
    assert result.exit_code == 0, result.output
    text = result.output
    config = load_config(run_file, {"rollout.group_size": 6})
    assert parse_config(tomllib.loads(text)) == config  # the output is the same run
    lines = text.splitlines()
    # the file's values, an override, and defaults it never set, each under its doc
    at = lines.index("group_size = 6")
    assert (
        lines[at - 1] == "# Rollouts per scenario. Advantages are relative to the group: 1 gives no signal."
    )
    at = lines.index("lr = 0.0001")  # [optim] from the file
    assert lines[at - 1].startswith("# AdamW learning rate. 2e-4 is what the capitals demo learns with")
    assert "max_refill_draws = 4" in lines and "zero_variance_warning = 0.5" in lines
    assert "# init_adapter = (unset)" in lines and "# [judge] (unset)" in lines
    assert "[watch.length_drift]" in lines and "[sft]" in lines
    leaves = [name.rsplit(".", 1)[-1] for name, _ in _fields(RunConfig) if not name.startswith("judge.")]
    written = [
        line.split(" = ")[0].lstrip("# ")
        for line in lines
        if " = " in line and not line.startswith("# ") or line.endswith("= (unset)")
    ]
    assert sorted(set(leaves)) == sorted(set(written))


def test_show_without_a_file_prints_the_defaults_and_an_sft_file_as_sft():
    result = CliRunner().invoke(cli_app, ["config", "show"])
    assert result.exit_code == 0 and parse_config(tomllib.loads(result.output)) == RunConfig()
    assert "lr = 0.0002" in result.output.splitlines()
    sft_file = ROOT / "examples" / "agents" / "corpus_search_sft.toml"
    result = CliRunner().invoke(cli_app, ["config", "show", str(sft_file)])
    assert result.exit_code == 0 and parse_sft_config(tomllib.loads(result.output)) == load_sft_config(
        sft_file
    )


def test_a_bad_field_is_one_line():
    result = CliRunner().invoke(cli_app, ["config", "show", "--set", "rollout.group_size=1"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "the defaults: rollout.group_size: Input should be greater than or equal to 2 (got 1)"
    )
