"""Sampling with the adapter folded into the weights draws what peft's LoRA layers draw, follows
every optimizer step, and never touches the base weights."""

from __future__ import annotations

import pytest
import torch

from grooves.config import LoraConfig
from grooves.policy.fast import FastPaths
from grooves.policy.fast.decode import decoder_for
from grooves.policy.sampling import SamplingParams, sample
from grooves.policy.transformers import TransformersPolicy
from grooves.training.optim import adamw


def _randomize_lora_b(model, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero, where folding would be trivially exact
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def _params(seed: int) -> list[SamplingParams]:
    return [SamplingParams(n=4, max_tokens=12, temperature=1.0, seed=seed)]


def _through_peft_layers(policy, prompt, seed):
    return sample(
        policy.model,
        policy.tokenizer,
        [prompt],
        _params(seed),
        eos_token_ids=policy.prompts.eos_token_ids,
        decoder=decoder_for,
    )[0]


def _assert_same_draws(merged, unmerged) -> None:
    assert [c.token_ids for c in merged] == [c.token_ids for c in unmerged]
    for a, b in zip(merged, unmerged, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


@pytest.fixture()
def policy(tiny_model_dir):
    torch.manual_seed(0)
    policy = TransformersPolicy(str(tiny_model_dir), lora=LoraConfig(rank=4, alpha=8), seed=0)
    _randomize_lora_b(policy.model, seed=1)
    return policy


@pytest.mark.parametrize("fused", [False, True], ids=["adamw", "fused-adamw"])
def test_folded_sampling_matches_the_lora_layers_before_and_after_an_optimizer_step(policy, fused):
    prompt = policy.prompts.render([{"role": "user", "content": "name a colour"}], None)
    base = {n: p.detach().clone() for n, p in policy.model.named_parameters() if "base_layer" in n}

    _assert_same_draws(policy.generate([prompt], _params(3))[0], _through_peft_layers(policy, prompt, 3))

    # a real AdamW step writes the adapter in place; the folded weights must follow it, also when
    # the fused kernel (grooves' default) writes without bumping the tensors' version counters
    params = [p for p in policy.model.parameters() if p.requires_grad]
    if fused:
        optimizer = adamw(params, lr=0.05, betas=(0.9, 0.999), weight_decay=0.01)
    else:
        optimizer = torch.optim.AdamW(params, lr=0.05)
    ids = torch.tensor([prompt])
    before = policy.generate([prompt], _params(3))[0]
    policy.model.train()
    loss = policy.model(input_ids=ids).logits[0, -1].log_softmax(-1)[before[0].token_ids[0]]
    loss.backward()
    optimizer.step()
    policy.model.eval()

    after = policy.generate([prompt], _params(3))[0]
    _assert_same_draws(after, _through_peft_layers(policy, prompt, 3))
    layer, folded = (
        policy.sampler.fast.merged.layers[0],
        policy.sampler.fast.merged._buffers[0],
    )  # sampling ran on W + s B A
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    assert torch.allclose(folded, layer.base_layer.weight + layer.scaling["default"] * b @ a, atol=1e-6)
    assert (
        after[0].logprobs[0] < before[0].logprobs[0] - 1e-3
    )  # the step lowered that token, and sampling saw it

    # the frozen base weights are bit for bit what they were, and the adapter still trains
    for n, p in policy.model.named_parameters():
        if "base_layer" in n:
            assert torch.equal(p, base[n]), n
    assert all(p.requires_grad for n, p in policy.model.named_parameters() if "lora_" in n)


def test_folding_can_be_switched_off_and_then_samples_through_peft(tiny_model_dir):
    torch.manual_seed(0)
    policy = TransformersPolicy(
        str(tiny_model_dir), lora=LoraConfig(rank=4, alpha=8), seed=0, fast=FastPaths(fold_lora=False)
    )
    _randomize_lora_b(policy.model, seed=1)
    prompt = policy.prompts.render([{"role": "user", "content": "name a colour"}], None)
    assert policy.sampler.fast.merged is None
    _assert_same_draws(policy.generate([prompt], _params(5))[0], _through_peft_layers(policy, prompt, 5))
