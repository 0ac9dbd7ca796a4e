"""LoRA layers as one addmm give peft's outputs and gradients, and step aside wherever peft's forward differs."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from grooves.config import LoraConfig
from grooves.policy.fast.lora_addmm import addmm_lora, plain_adapter
from grooves.policy.transformers import TransformersPolicy


def _policy(model_dir, dropout=0.0):
    policy = TransformersPolicy(str(model_dir), lora=LoraConfig(rank=4, alpha=8, dropout=dropout), seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero, where the adapter's term would vanish
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return policy


def _forward_backward(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    logits.log_softmax(-1)[..., 7].sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


class _CountAddmm(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += func is torch.addmm
        return func(*args, **(kwargs or {}))


def test_outputs_and_adapter_gradients_match_peft(peaked_model_dir):
    policy = _policy(peaked_model_dir)
    model = policy.model.train()
    ids = torch.randint(0, 400, (2, 11), generator=torch.Generator().manual_seed(0))
    logits, grads = _forward_backward(model, ids)
    with addmm_lora(model), _CountAddmm() as counted:
        fused_logits, fused_grads = _forward_backward(model, ids)
    assert counted.calls == 7 * 2  # every LoRA layer of the 2 blocks took the addmm path
    assert torch.allclose(fused_logits, logits, atol=1e-5)
    assert (
        sorted(fused_grads) == sorted(grads) and len(grads) == 2 * 7 * 2
    )  # A and B of 7 targets in 2 blocks
    for name, g in grads.items():
        assert torch.allclose(fused_grads[name], g, atol=1e-5, rtol=1e-4), name
    assert all("forward" not in vars(m) for m in model.modules())  # peft's forward is back


def test_disabled_adapters_inside_run_the_base_model(peaked_model_dir):
    policy = _policy(peaked_model_dir)
    model = policy.model.eval()
    ids = torch.randint(0, 400, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        with model.disable_adapter():
            base = model(input_ids=ids).logits
        adapted = model(input_ids=ids).logits
        with addmm_lora(model):
            with model.disable_adapter():  # the reference logprobs of a KL penalty
                assert torch.equal(model(input_ids=ids).logits, base)
            assert torch.allclose(model(input_ids=ids).logits, adapted, atol=1e-5)
    assert not torch.allclose(base, adapted, atol=1e-3)  # the adapter does change the output


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_only_plain_layers_take_the_addmm_path(peaked_model_dir, dropout):
    policy = _policy(peaked_model_dir, dropout=dropout)
    layer = policy.model.base_model.model.model.layers[0].mlp.down_proj
    assert plain_adapter(layer) == ("default" if dropout == 0 else None)  # dropout draws: peft's forward
    with policy.model.disable_adapter():
        assert plain_adapter(layer) is None
