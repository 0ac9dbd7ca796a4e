"""Memory for larger bases: gradient checkpointing (same gradient), bf16 training with a float32
adapter, `optim.micro_batch_tokens` chosen from the free memory when unset, and attention's T x T
memory counted when micro-batches are filled."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
import torch

from grooves.config import parse_config
from grooves.config.optim import OptimConfig
from grooves.core.batching import longest_row, micro_batches
from grooves.core.forward import token_logprobs
from grooves.core.tokenize import TrainSequence
from grooves.training.loop import train
from grooves.training.memory import (
    auto_micro_batch_tokens,
    bytes_per_pair,
    bytes_per_token,
    pair_tokens,
    tokens_for,
)


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


TINY_TOKEN_BYTES = 2 * (10 * 32 + 4 * 64) * 4 + 487 * (2 * 4 + 4)
"""The tiny Llama's bytes per token (2 layers, 32 wide, MLP 64, vocabulary 487, float32): 10452."""


def _seq(n: int, group: int = 0) -> TrainSequence:
    return TrainSequence([5] * n, [False] + [True] * (n - 1), [0.0] * n, 1.0, group, 1)


def test_attention_is_counted_per_pair_of_a_rows_positions(tiny_model_dir):
    """The estimate adds 16 bytes per pair of a row's positions (sdpa's mask), and micro-batches
    hold rows whose tokens plus pairs fit the budget: hand-computed for the tiny Llama."""
    from grooves.policy.transformers import TransformersPolicy

    policy = TransformersPolicy(str(tiny_model_dir), served_name="tiny")
    assert TINY_TOKEN_BYTES == 10452
    # sdpa: the mask alone; eager: + (2 layers + 1) x 4 heads x 4 bytes of probabilities and scores
    assert bytes_per_pair(layers=2, heads=4, dtype_bytes=4, checkpointing=False, attention="sdpa") == 16
    assert bytes_per_pair(layers=2, heads=4, dtype_bytes=4, checkpointing=False, attention="eager") == 64
    assert bytes_per_pair(layers=2, heads=4, dtype_bytes=4, checkpointing=True, attention="eager") == 48
    pairs = pair_tokens(policy.model, checkpointing=False)
    assert pairs == Fraction(16, 10452)
    # the widest row of 65536 tokens' budget: 6224 + 6224^2 x 16 / 10452 = 65524.7 <= 65536 < 65544.8 (6225)
    assert longest_row(65536, pairs) == 6224
    opt = OptimConfig(micro_batch_tokens=65536)
    seqs = [_seq(3000, g) for g in range(3)]
    # counted as tokens alone, the three share one packed row of 9000: 9000^2 x 16 = 1.3 GB of mask
    assert [b.input_ids.shape for b, _ in micro_batches(seqs, opt, 0)] == [(1, 9000)]
    packed = micro_batches(seqs, opt, 0, pair_cost=pairs)
    assert [b.input_ids.shape for b, _ in packed] == [(1, 6000), (1, 3000)]
    padding = opt.model_copy(update={"packing": False})
    four = [_seq(3000, g) for g in range(4)]
    assert [b.input_ids.shape for b, _ in micro_batches(four, padding, 0)] == [(4, 3000)]
    # a padded row of 3000 costs 3000 + 3000^2 x 16 / 10452 = 16777 tokens: 3 fit in 65536
    padded = micro_batches(four, padding, 0, pair_cost=pairs)
    assert [b.input_ids.shape for b, _ in padded] == [(3, 3000), (1, 3000)]
    for batch, _ in packed + padded:
        rows, width = batch.input_ids.shape
        assert rows * (width * TINY_TOKEN_BYTES + width**2 * 16) <= 65536 * TINY_TOKEN_BYTES


def test_the_estimate_bounds_what_autograd_keeps_for_a_packed_row(tiny_model_dir):
    """What a packed row of 4096 tokens keeps for its backward (distinct storages) is more than the
    per-token estimate alone, and within it once the pairs are counted."""
    from grooves.core.tokenize import pack_batches
    from tiny_models import lora_policy

    model = lora_policy(tiny_model_dir).model
    (batch,) = pack_batches([_seq(2048), _seq(2048)], 4096)
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        kept[storage.data_ptr()] = storage.nbytes()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, _ = token_logprobs(model, batch)
    lp.sum().backward()
    model.zero_grad(set_to_none=True)
    model.eval()
    saved = sum(kept.values())
    shape = {"layers": 2, "dtype_bytes": 4, "checkpointing": False}
    tokens = 4096 * bytes_per_token(hidden=32, intermediate=64, vocab=487, **shape)  # 42.8 MB
    pairs = 4096**2 * bytes_per_pair(heads=4, attention="sdpa", **shape)  # 268 MB
    assert saved > tokens, (saved, tokens)  # the [1, 1, 4096, 4096] float32 mask alone is 67 MB
    assert saved <= tokens + pairs, saved
