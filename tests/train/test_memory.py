"""Memory for larger bases: gradient checkpointing (same gradient), bf16 training with a float32
adapter, and `optim.micro_batch_tokens` chosen from the free memory when unset."""

from __future__ import annotations

import json

import pytest
import torch

from grooves.config import parse_config
from grooves.train.loop import train
from grooves.train.memory import auto_micro_batch_tokens, bytes_per_token, tokens_for


@pytest.fixture(scope="module")
def step_policy(tiny_model_dir):
    from dp_step_worker import build_policy

    torch.set_num_threads(1)
    return build_policy(str(tiny_model_dir), "float32")


def _keep(policy) -> dict:
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}


def _restore(policy, weights: dict) -> None:
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if n in weights:
                p.copy_(weights[n])


def _saved_bytes(fn) -> tuple[dict, int]:
    """`fn()`'s result and the bytes of the tensors autograd kept for the backward outside
    checkpointed regions (a checkpointed layer keeps its input and packs the rest itself)."""
    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = fn()
    return result, sum(saved)


def test_gradient_checkpointing_gives_the_same_gradient(step_policy):
    from dp_step_worker import run_step

    start = _keep(step_policy)
    plain, plain_bytes = _saved_bytes(lambda: run_step(step_policy))
    _restore(step_policy, start)
    checkpointed, kept_bytes = _saved_bytes(lambda: run_step(step_policy, gradient_checkpointing=True))
    _restore(step_policy, start)
    assert kept_bytes < 0.5 * plain_bytes, (kept_bytes, plain_bytes)  # the layers' activations were not kept
    for name, grad in plain["grads"].items():
        assert (checkpointed["grads"][name] - grad).abs().max() <= 1e-6, name
    assert checkpointed["stats"]["loss"] == pytest.approx(plain["stats"]["loss"], rel=1e-6)
    assert not step_policy.model.get_base_model().model.layers[0].gradient_checkpointing  # off after the step


def test_bf16_trains_a_float32_adapter(tiny_model_dir):
    """A bf16 base (model.dtype = "bfloat16", the GPU setting) keeps the adapter and AdamW's state in
    float32, and its gradient is the float32 run's to within bf16's rounding."""
    from dp_step_worker import build_policy, run_step

    reference = run_step(build_policy(str(tiny_model_dir), "float32"))
    policy = build_policy(str(tiny_model_dir), "bfloat16")
    assert {p.dtype for p in policy.model.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert {p.dtype for p in policy.model.parameters() if p.requires_grad} == {torch.float32}
    bf16 = run_step(policy)
    num = sum(((bf16["grads"][n] - g) ** 2).sum() for n, g in reference["grads"].items()) ** 0.5
    den = sum((g**2).sum() for g in reference["grads"].values()) ** 0.5
    assert float(num / den) < 0.03
    assert all(g.dtype == torch.float32 for g in bf16["grads"].values())


def test_micro_batch_tokens_follow_the_free_memory(tiny_model_dir):
    from grooves.policy.transformers import TransformersPolicy

    policy = TransformersPolicy(str(tiny_model_dir), served_name="tiny")
    config = policy.model.config  # 2 layers, 32 wide, MLP 64, float32
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (2, 32, 64)
    vocab = config.vocab_size
    per = (10 * 32 + 4 * 64) * 4  # one layer's activations per token
    plain = 2 * per + vocab * (2 * 4 + 4)
    checkpointed = 2 * 32 * 4 + per + vocab * (2 * 4 + 4)  # one vector per layer, one layer's intermediates
    assert (
        bytes_per_token(layers=2, hidden=32, intermediate=64, vocab=vocab, dtype_bytes=4, checkpointing=False)
        == plain
    )
    # half of the free memory holds 4000 tokens -> 2048, the power of two below
    free = 2 * 4000 * plain
    assert auto_micro_batch_tokens(policy.model, "cpu", checkpointing=False, free=free) == 2048
    assert 4096 <= 4000 * plain // checkpointed < 8192  # checkpointed, more than 4096 fit
    assert auto_micro_batch_tokens(policy.model, "cpu", checkpointing=True, free=free) == 4096
    assert tokens_for(0, plain) == 256 and tokens_for(2**50, plain) == 65536


def test_an_unset_micro_batch_is_chosen_once_and_written_down(peaked_model_dir, tmp_path, capsys):
    config = parse_config(
        {
            "output_dir": str(tmp_path / "run"),
            "steps": 1,
            "task": "toy_tokens",
            "task_options": {"vocab_size": 487, "num_scenarios": 8},
            "model": {"base_model": str(peaked_model_dir)},
            "rollout": {"group_size": 2, "groups_per_step": 2, "max_tokens": 3},
            "validation": {"every": 0, "scenarios": 2},
            "logging": {"progress": True},
        }
    )
    assert config.optim.micro_batch_tokens is None
    run_dir = train(config)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    chosen = rows[-1]["micro_batch_tokens"]
    assert chosen == 65536  # a tiny model: the cap, whatever this machine has free
    assert f"micro_batch_tokens = {chosen}" in (run_dir / "config.toml").read_text()
    assert f"optim.micro_batch_tokens = {chosen}, from the free memory of cpu" in capsys.readouterr().err
