"""The trainer's forward on the sampler's packed folded weights gives peft's logits and adapter
gradients, follows the adapter between forwards, and steps aside wherever it cannot run."""

from __future__ import annotations

import pytest
import torch

from grooves.policy.fast import FastPaths, packed_training
from grooves.policy.fast.kernels import blocked_layout
from grooves.policy.sampling import SamplingParams
from grooves.training.step import checkpointed_layers
from tiny_models import build_tiny_model_dir, lora_policy


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def wide_model_dir(request, tmp_path_factory):
    """Hidden size 64: every group of weights is whole 64-row blocks of oneDNN's layout on AVX2."""
    if blocked_layout(64, 64, 8) is None:
        pytest.skip("oneDNN's packed layout is opaque on this CPU: the sampler packs a dense fold instead")
    return build_tiny_model_dir(
        tmp_path_factory.mktemp(f"{request.param}-64"),
        architecture=request.param,
        hidden_size=64,
        init_std=0.2,
    )


def _sample(policy) -> None:
    prompt = policy.prompts.render([{"role": "user", "content": "hi"}], None)
    policy.generate([prompt], [SamplingParams(n=2, max_tokens=4, seed=3)])


def _forward_backward(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    logits.log_softmax(-1)[..., 7].sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


class _Count:
    """Counts the groups that ran on the packed folds (`calls`) and the output head's packed runs (`heads`)."""

    def __init__(self, monkeypatch):
        self.calls = self.heads = 0
        group, head = packed_training._FoldedGroup.apply, packed_training._PackedLinear.apply

        def counted(*args):
            self.calls += 1
            return group(*args)

        def counted_head(*args):
            self.heads += 1
            return head(*args)

        monkeypatch.setattr(packed_training._FoldedGroup, "apply", counted)
        monkeypatch.setattr(packed_training._PackedLinear, "apply", counted_head)


def _scale_a(policy, factor) -> None:
    with torch.no_grad():  # in place, as AdamW writes: no new tensor, no version the fold sees
        for name, p in policy.model.named_parameters():
            if "lora_A" in name:
                p.mul_(factor)


def test_logits_and_adapter_gradients_match_peft_and_follow_the_adapter(wide_model_dir, monkeypatch):
    policy = lora_policy(wide_model_dir)
    model = policy.model
    _sample(policy)  # packs the folded weights
    counted = _Count(monkeypatch)
    ids = torch.randint(0, 400, (2, 11), generator=torch.Generator().manual_seed(0))
    for step in range(2):
        model.train()
        logits, grads = _forward_backward(model, ids)  # peft's layers
        with policy.training_phase():
            folded_logits, folded_grads = _forward_backward(model, ids)
        assert counted.calls == 4 * 2 * (step + 1)  # q/k/v, o, gate/up, down of 2 blocks, each one matmul
        assert counted.heads == step + 1  # and the output head on its packed copy
        assert torch.allclose(folded_logits, logits, atol=1e-5)
        assert (
            sorted(folded_grads) == sorted(grads) and len(grads) == 2 * 7 * 2
        )  # A and B of 7 targets, 2 blocks
        for name, g in grads.items():  # float rounding, relative to the gradient's scale
            assert (folded_grads[name] - g).abs().max() <= 1e-5 * g.abs().max(), name
        _scale_a(policy, -1.5)  # an optimizer step and no sampling batch between: the fold must follow
    assert all("forward" not in vars(m) for m in model.modules())  # peft's forward is back
    with torch.no_grad(), policy.training_phase(), model.disable_adapter():  # a KL penalty's reference
        base = model(input_ids=ids).logits
    with torch.no_grad(), model.disable_adapter():
        assert torch.equal(base, model(input_ids=ids).logits)
    assert counted.calls == 4 * 2 * 2


def test_under_gradient_checkpointing_the_recomputed_groups_give_the_same_gradients(
    wide_model_dir, monkeypatch
):
    policy = lora_policy(wide_model_dir)
    model = policy.model
    _sample(policy)
    ids = torch.randint(0, 400, (2, 9), generator=torch.Generator().manual_seed(4))
    _, grads = _forward_backward(model.train(), ids)
    counted = _Count(monkeypatch)
    with policy.training_phase(), checkpointed_layers(model, True):
        _, checkpointed = _forward_backward(model, ids)
    assert counted.calls == 2 * 4 * 2  # every group ran twice: forward, then recomputed in the backward
    for name, g in grads.items():
        assert (checkpointed[name] - g).abs().max() <= 1e-5 * g.abs().max(), name


def test_training_borrows_the_packed_folds_and_never_makes_them(wide_model_dir, monkeypatch):
    policy = lora_policy(wide_model_dir)
    counted = _Count(monkeypatch)
    ids = torch.randint(0, 400, (1, 7), generator=torch.Generator().manual_seed(1))
    with policy.training_phase():
        _forward_backward(policy.model.train(), ids)
    kernels = policy.sampler.fast.kernels
    assert counted.calls == counted.heads == 0  # nothing sampled yet: nothing packed, nothing made
    assert not kernels.folded._entries and not kernels.packed._entries
    _sample(policy)
    with policy.training_phase():
        _forward_backward(policy.model.train(), ids)
    assert counted.calls == 4 * 2


def test_a_layer_called_on_another_input_than_its_group_runs_on_its_own(wide_model_dir, monkeypatch):
    policy = lora_policy(wide_model_dir)
    _sample(policy)
    attn = policy.model.get_base_model().model.layers[0].self_attn
    x, other = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(2)).unbind(0)
    with torch.no_grad():
        expected = attn.k_proj(other), attn.v_proj(x)
    counted = _Count(monkeypatch)
    with torch.no_grad(), policy.training_phase():
        attn.q_proj(x)  # computes k and v for x as well
        k, v = attn.k_proj(other), attn.v_proj(x)
    assert counted.calls == 1
    assert torch.allclose(k, expected[0], atol=1e-5)  # its own forward on its own input
    assert torch.allclose(v, expected[1], atol=1e-5)  # the group's output for x


def test_without_packed_folds_training_runs_peft_s_layers_through_addmm(wide_model_dir, monkeypatch):
    policy = lora_policy(wide_model_dir, fast=FastPaths(packed_decode=False))
    _sample(policy)
    assert policy.sampler.fast.trainer_folds(policy.model) is None
    counted = _Count(monkeypatch)
    with policy.training_phase():
        _forward_backward(policy.model.train(), torch.tensor([[3, 5, 7]]))
    assert counted.calls == 0


@pytest.mark.parametrize(
    ("targets", "groups"),
    [
        (["q_proj", "k_proj", "v_proj", "o_proj"], 2),  # q/k/v and o; gate/up and down have no adapter
        (["q_proj", "v_proj"], 1),  # q/k/v with k at rank 0
        (["gate_proj", "up_proj", "down_proj"], 2),
    ],
    ids=["attention", "q-v", "mlp"],
)
def test_layers_of_a_group_that_lora_leaves_out_run_in_it_at_rank_zero(
    wide_model_dir, targets, groups, monkeypatch
):
    policy = lora_policy(wide_model_dir, targets=targets)
    model = policy.model
    _sample(policy)
    counted = _Count(monkeypatch)
    ids = torch.randint(0, 400, (2, 11), generator=torch.Generator().manual_seed(0))
    logits, grads = _forward_backward(model.train(), ids)  # peft's layers
    with policy.training_phase():
        folded_logits, folded_grads = _forward_backward(model, ids)
    assert counted.calls == groups * 2  # each group holding an adapter: one matmul, in each of 2 blocks
    assert torch.allclose(folded_logits, logits, atol=1e-5)
    assert sorted(folded_grads) == sorted(grads) and len(grads) == 2 * len(targets) * 2  # A and B, 2 blocks
    for name, g in grads.items():
        assert (folded_grads[name] - g).abs().max() <= 1e-5 * g.abs().max(), name
