"""The planned output head computes the same product in either matmul form and puts the model back."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from grooves.policy.fast.output_head import HeadPlan, PlannedHead, PlannedLinear


def test_both_matmul_forms_give_the_linear_layers_output_for_every_row_count():
    torch.manual_seed(0)
    linear = torch.nn.Linear(24, 300, bias=True)
    plan = HeadPlan(linear.weight)
    x = torch.randn(1, 5, 24)  # [B, T, in] as a model passes it
    for rows in range(1, 10):
        plan.fix({r: bool(rows % 2) for r in range(2, 9)})
        xr = torch.randn(rows, 1, 24)
        assert torch.allclose(PlannedLinear(linear, plan)(xr), linear(xr), atol=1e-5)
    assert torch.allclose(PlannedLinear(linear, plan)(x), linear(x), atol=1e-5)
    assert (
        plan.transposed(1) is False and plan.transposed(40) is False
    )  # a vector product and a prefill keep x W^T


def test_a_timed_plan_decides_once_per_row_count():
    plan = HeadPlan(torch.randn(4096, 64))
    first = [plan.transposed(r) for r in range(2, 9)]
    assert sorted(plan.chosen()) == list(range(2, 9))
    assert [plan.transposed(r) for r in range(2, 9)] == first  # remembered, not re-timed


def test_weights_off_the_cpu_are_never_timed():
    plan = HeadPlan(
        torch.empty(4096, 64, device="meta")
    )  # host timers cannot measure asynchronous GPU kernels
    assert [plan.transposed(r) for r in range(2, 9)] == [False] * 7
    assert plan.chosen() == {}


def test_planned_head_is_swapped_in_only_inside_and_keeps_the_logits(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    head = model.get_output_embeddings()
    ids = torch.randint(0, 100, (3, 7))
    with torch.no_grad():
        expected = model(input_ids=ids).logits[:, -1]
        planned = PlannedHead()
        with planned.applied(model):
            assert isinstance(model.get_output_embeddings(), PlannedLinear)
            planned.plan.fix({r: True for r in range(2, 9)})  # force the other form at 3 rows
            got = model(input_ids=ids, logits_to_keep=1).logits[:, -1]
    assert model.get_output_embeddings() is head
    assert torch.allclose(got, expected, atol=1e-5)
