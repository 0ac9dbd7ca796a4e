"""Every shipped run file loads: a typo in an example fails here, not on a user's machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from grooves.config import load_config

ROOT = Path(__file__).resolve().parents[2]
RUN_FILES = sorted([*ROOT.glob("examples/*.toml"), *ROOT.glob("examples/hn_titles/*.toml")])


def test_there_are_run_files():
    assert len(RUN_FILES) >= 4


@pytest.mark.parametrize("path", RUN_FILES, ids=lambda p: p.name)
def test_run_file_loads(path):
    config = load_config(path)
    assert config.steps >= 1 and config.name
