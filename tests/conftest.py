"""Shared fixtures: a tiny random model directory, built once per test session."""

from __future__ import annotations

import pytest
import torch

from grooves.testing import build_tiny_model_dir

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama with SmolLM2's chat template, saved as a Hugging Face directory."""
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def peaked_model_dir(tmp_path_factory):
    """Like `tiny_model_dir` but initialized with std 0.2: peaked distributions that RL can move fast."""
    return build_tiny_model_dir(tmp_path_factory.mktemp("peaked-model"), init_std=0.2)
