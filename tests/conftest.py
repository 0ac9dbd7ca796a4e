"""Shared fixtures: a tiny random model directory, built once per test session.

Tests import helpers from three places besides grooves: this folder (`tiny_models`,
`scripted_judge`), `benchmarks/` (`synthetic_runs`, `random_model`: fixtures the benchmarks
measure with) and `examples/` (the `hn_titles` task).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "examples")]

from tiny_models import build_tiny_model_dir  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama with SmolLM2's chat template, saved as a Hugging Face directory."""
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def peaked_model_dir(tmp_path_factory):
    """Like `tiny_model_dir` but initialized with std 0.2: peaked distributions that RL can move fast."""
    return build_tiny_model_dir(tmp_path_factory.mktemp("peaked-model"), init_std=0.2)
