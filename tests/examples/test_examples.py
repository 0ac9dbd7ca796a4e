"""Every shipped run file loads: a typo in an example fails here, not on a user's machine."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from grooves.config import dump_config, load_config, load_sft_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
SFT_FILES = sorted(ROOT.glob("examples/**/*_sft.toml"))
RUN_FILES = sorted(
    p
    for p in [
        *ROOT.glob("examples/*.toml"),
        *ROOT.glob("examples/hn_titles/*.toml"),
        *ROOT.glob("examples/agents/*.toml"),
        *ROOT.glob("examples/envs/*.toml"),
    ]
    if p not in SFT_FILES
)


def test_there_are_run_files():
    assert len(RUN_FILES) >= 4


@pytest.mark.parametrize("path", RUN_FILES, ids=lambda p: p.name)
def test_run_file_loads_and_its_resolved_config_reads_back_the_same(path):
    config = load_config(path)  # what a run saves as config.toml, and a checkpoint holds, must load as it was
    assert parse_config(tomllib.loads(dump_config(config))) == config


@pytest.mark.parametrize("path", SFT_FILES, ids=lambda p: p.name)
def test_sft_run_file_loads(path):
    assert load_sft_config(path).data


PUBLIC = {
    "grooves",
    "grooves.judge",
    "grooves.rewards",
    "grooves.watch",
    "grooves.envs",
    "grooves.tasks",
    "grooves.remote",
}
"""What user code imports grooves from: the package's own names and its public subpackages'."""


def test_examples_import_grooves_only_through_its_public_face():
    import ast

    deep = []
    for path in sorted((ROOT / "examples").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            deep += [
                f"{path.relative_to(ROOT)}: {n}"
                for n in names
                if n.split(".")[0] == "grooves" and n not in PUBLIC
            ]
    assert deep == []
    import grooves

    for name in grooves.__all__:  # every exported name resolves
        assert getattr(grooves, name) is not None, name
