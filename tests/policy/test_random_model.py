"""benchmarks/random_model.py: a random-weight model in a named architecture that grooves trains and samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from random_model import SHAPES, build

from grooves.config import LoraConfig
from grooves.policy.sampling import SamplingParams
from grooves.policy.transformers import TransformersPolicy


@pytest.fixture(scope="module")
def random_qwen(tiny_model_dir, tmp_path_factory):
    return build(
        "qwen2.5-1.5b",
        tiny_model_dir,
        tmp_path_factory.mktemp("random") / "qwen",
        dtype="float32",
        num_layers=2,
    )


def test_the_architecture_is_the_shapes_and_the_vocabulary_the_tokenizers(random_qwen, tiny_model_dir):
    config = json.loads((random_qwen / "config.json").read_text())
    shape = SHAPES["qwen2.5-1.5b"]
    assert config["model_type"] == "qwen2"
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
        assert config[key] == shape[key], key
    assert config["num_hidden_layers"] == 2
    tokenizer_config = json.loads((Path(tiny_model_dir) / "tokenizer.json").read_text())
    assert config["vocab_size"] >= len(tokenizer_config["model"]["vocab"])
    marker = json.loads((random_qwen / "random_weights.json").read_text())
    # embeddings (tied) + 2 blocks: 4 attention projections with q/k/v biases, the MLP's 3, two norms
    h, i, kv = 1536, 8960, 1536 * 2 // 12
    block = h * h * 2 + h * kv * 2 + (h + 2 * kv) + 3 * h * i + 2 * h
    assert marker["parameters"] == config["vocab_size"] * h + 2 * block + h


def test_grooves_samples_and_takes_a_gradient_step_on_it(random_qwen):
    policy = TransformersPolicy(str(random_qwen), lora=LoraConfig(rank=4, alpha=8), seed=0)
    prompt = policy.prompts.render([{"role": "user", "content": "hi"}], None)
    [completions] = policy.generate([prompt], [SamplingParams(n=2, max_tokens=6, seed=0)])
    assert len(completions) == 2
    assert all(0 < len(c.token_ids) == len(c.logprobs) <= 6 for c in completions)
    assert all(lp < 0 for c in completions for lp in c.logprobs)
    ids = torch.tensor([prompt + completions[0].token_ids])
    loss = policy.model(input_ids=ids).logits[0, -1].logsumexp(-1)
    loss.backward()
    assert any(
        p.grad is not None and p.grad.abs().sum() > 0
        for n, p in policy.model.named_parameters()
        if "lora_B" in n
    )


def test_an_unknown_shape_or_a_missing_tokenizer_is_a_clear_error(tmp_path, tiny_model_dir):
    with pytest.raises(SystemExit, match="not one of"):
        build("llama-70b", tiny_model_dir, tmp_path / "x")
    with pytest.raises(SystemExit, match="gpu_bundle.sh"):
        build("qwen2.5-1.5b", tmp_path, tmp_path / "y")
