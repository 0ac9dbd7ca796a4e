"""Every shipped run file loads: a typo in an example fails here, not on a user's machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from grooves.config import load_config, load_sft_config

ROOT = Path(__file__).resolve().parents[2]
SFT_FILES = sorted(ROOT.glob("examples/**/*_sft.toml"))
RUN_FILES = sorted(
    p
    for p in [
        *ROOT.glob("examples/*.toml"),
        *ROOT.glob("examples/hn_titles/*.toml"),
        *ROOT.glob("examples/agents/*.toml"),
    ]
    if p not in SFT_FILES
)


def test_there_are_run_files():
    assert len(RUN_FILES) >= 4


@pytest.mark.parametrize("path", RUN_FILES, ids=lambda p: p.name)
def test_run_file_loads(path):
    config = load_config(path)
    assert config.steps >= 1 and config.name


@pytest.mark.parametrize("path", SFT_FILES, ids=lambda p: p.name)
def test_sft_run_file_loads(path):
    assert load_sft_config(path).data
