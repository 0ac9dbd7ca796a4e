"""Policies on one `SharedBase`: the base weights once in memory, an adapter and a training step each."""

from __future__ import annotations

import torch

from grooves.config import LoraConfig, ModelConfig
from grooves.policy import policy_for, shared_base
from grooves.policy.sampling import SamplingParams


def test_policies_on_a_shared_base_share_weights_not_adapters(tiny_model_dir):
    base = shared_base(str(tiny_model_dir))
    model = ModelConfig(base_model=str(tiny_model_dir))
    a, b = (policy_for(model, LoraConfig(rank=2), seed=0, served_name=n, base=base) for n in "ab")
    assert a.lock is b.lock is base.lock
    qa = a.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    qb = b.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert qa is not qb and qa.data_ptr() == qb.data_ptr()  # own Parameter objects, one storage
    before_b = {n: p.detach().clone() for n, p in b.model.named_parameters()}
    frozen = qa.detach().clone()

    # a step on a (LoRA B starts at zero, so B moves): b (adapter and base) and the shared weights stay
    params = [p for p in a.model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=1.0)
    ids = torch.tensor([[1, 5, 9, 13, 17]])
    a.model.train()
    a.model(input_ids=ids).logits.sum().backward()
    optimizer.step()
    a.model.eval()
    assert any(not torch.equal(p, before_b[n]) for n, p in a.model.named_parameters() if p.requires_grad)
    assert all(torch.equal(p, before_b[n]) for n, p in b.model.named_parameters())
    assert torch.equal(qa, frozen)

    # sampling a (its adapter folded into buffers of its own) leaves b's answers as they were
    params_ = [SamplingParams(n=1, max_tokens=4, temperature=0.0)]
    first = b.generate([[1, 5, 9]], params_)[0][0].token_ids
    a.generate([[1, 5, 9]], params_)
    assert b.generate([[1, 5, 9]], params_)[0][0].token_ids == first
    assert torch.equal(qb, frozen)
