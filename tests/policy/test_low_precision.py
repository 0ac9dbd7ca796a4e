"""The decode kernels: oneDNN on packed float32 weights draws what MKL draws; int8 and bfloat16
base weights carry the float32 adapter on top; a model they cannot run is refused on one line."""

from __future__ import annotations

import pytest
import torch

from grooves.config import ConfigError, RunConfig, check_against_model
from grooves.config.check import cpu_packs_bfloat16
from grooves.policy.fast import FastPaths
from grooves.policy.fast.kernels import (
    LowPrecisionKernels,
    PackedKernels,
    PlainKernels,
    blocked_layout,
    packed_memory,
    quantize_rows,
)
from grooves.policy.sampling import SamplingParams
from grooves.policy.transformers import TransformersPolicy
from tiny_models import build_tiny_model_dir, build_tiny_tokenizer, lora_policy


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_dir(request, tmp_path_factory):
    return build_tiny_model_dir(
        tmp_path_factory.mktemp(request.param), architecture=request.param, init_std=0.2
    )


def _prompts(policy) -> list[list[int]]:
    texts = ["hi", "a much longer question about the weather in Paris today"]  # left-padded batch
    return [policy.prompts.render([{"role": "user", "content": t}], None) for t in texts]


PRECISIONS = [
    "int8",
    pytest.param(
        "bfloat16",
        marks=pytest.mark.skipif(
            not cpu_packs_bfloat16(),
            reason="oneDNN packs bfloat16 weights only on AVX512 or AVX-NE-CONVERT CPUs",
        ),
    ),
]
"""The sampler precisions this CPU runs (`test_bfloat16_on_a_cpu_without_it_is_refused_with_one_line`
covers the other case)."""

PARAMS = [SamplingParams(n=3, max_tokens=9, seed=5), SamplingParams(n=2, max_tokens=15, seed=9)]


def _draws(policy):
    return [c for per in policy.generate(_prompts(policy), PARAMS) for c in per]


def test_the_packed_float32_decode_draws_the_plain_paths_tokens(model_dir):
    packed = lora_policy(model_dir)  # model.fast = "on"
    plain = lora_policy(model_dir, fast=FastPaths(packed_decode=False))
    assert isinstance(packed.sampler.fast.kernels, PackedKernels)
    assert isinstance(plain.sampler.fast.kernels, PlainKernels)
    a, b = _draws(packed), _draws(plain)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    for x, y in zip(a, b, strict=True):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
    assert len({len(c.token_ids) for c in a}) > 1  # rows left the batch at different steps


def test_every_row_count_runs_the_packed_kernel_unless_told_to_leave_one_row_to_mkl():
    """On a quiet machine oneDNN's packed kernel beat MKL at one row too (docs/speed.md)."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 512)
    one, eight = torch.randn(1, 1, 256), torch.randn(8, 1, 256)
    packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), 8)

    def onednn(x):
        rows = x.shape[0]
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, 256), packed, layer.bias, "none", [], "")
        return y.reshape(rows, 1, 512)

    run = PackedKernels().group([layer])
    assert torch.equal(run(one, False), onednn(one))
    assert torch.equal(run(eight, False), onednn(eight))
    mkl_for_one = PackedKernels(packed_from_rows=2).group([layer])
    assert torch.equal(mkl_for_one(one, False), torch.nn.functional.linear(one, layer.weight, layer.bias))
    assert torch.equal(mkl_for_one(eight, False), onednn(eight))


def test_the_block_layout_found_by_the_probe_is_what_onednn_packs():
    block = blocked_layout(128, 192, 8)
    if block is None:
        pytest.skip("oneDNN's packed layout is opaque on this CPU")
    weight = torch.randn(128, 192)
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 8)
    blocks = packed_memory(packed).view(128 // block, 192, block)  # packed[g, i, j] = W[g b + j, i]
    assert torch.equal(blocks, weight.view(128 // block, block, 192).transpose(1, 2))
    assert blocked_layout(96, 192, 8) is None or 96 % blocked_layout(96, 192, 8) == 0


def test_the_packed_weights_follow_the_adapter_after_an_optimizer_step(model_dir):
    packed = lora_policy(model_dir)
    plain = lora_policy(model_dir, fast=FastPaths(packed_decode=False))
    _draws(packed)  # packs the folded weights
    for policy in (packed, plain):
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if "lora_A" in name:
                    p.mul_(-1.5)  # in place, as AdamW writes: no new tensor, no version the fold sees
    a, b = _draws(packed), _draws(plain)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    for x, y in zip(a, b, strict=True):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def wide_model_dir(request, tmp_path_factory):
    """Hidden size 64: every group of weights is whole 64-row blocks of oneDNN's layout on AVX2."""
    return build_tiny_model_dir(
        tmp_path_factory.mktemp(f"{request.param}-64"),
        architecture=request.param,
        hidden_size=64,
        init_std=0.2,
    )


def test_the_adapter_folded_into_the_packed_weights_draws_the_plain_paths_tokens(wide_model_dir):
    if blocked_layout(64, 64, 8) is None:
        pytest.skip("oneDNN's packed layout is opaque on this CPU: the kernels pack a dense fold instead")
    packed = lora_policy(wide_model_dir)
    plain = lora_policy(wide_model_dir, fast=FastPaths(packed_decode=False))
    folds = packed.sampler.fast.merged
    assert not folds.dense and packed.sampler.fast.kernels.folds is folds  # no dense folded copy
    assert plain.sampler.fast.merged.dense
    for _ in range(2):
        a, b = _draws(packed), _draws(plain)
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        for x, y in zip(a, b, strict=True):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
        assert len(folds.layers) == 2 * 7 and packed.sampler.fast.kernels.folded._entries
        for policy in (packed, plain):  # then an update in place, as AdamW writes
            with torch.no_grad():
                for name, p in policy.model.named_parameters():
                    if "lora_A" in name:
                        p.mul_(-1.5)
    # outside a sampling batch nothing tells the kernels that the adapter is current
    layer = packed.model.get_base_model().model.layers[0].self_attn.q_proj
    assert packed.sampler.fast.kernels.group([layer]) is None


def test_quantize_rows_is_symmetric_per_output_row():
    w = torch.tensor([[0.5, -1.0, 0.25], [2.0, 0.0, -0.01], [0.0, 0.0, 0.0]])
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8
    assert scale.tolist() == pytest.approx([1.0 / 127, 2.0 / 127, 1.0])
    assert q.tolist() == [[64, -127, 32], [127, 0, -1], [0, 0, 0]]
    assert (q.float() * scale[:, None] - w).abs().max() <= scale.max() / 2


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_low_precision_layer_is_its_rounded_base_plus_the_float32_adapter(model_dir, precision):
    policy = lora_policy(model_dir, sampler_precision=precision)
    layer = policy.model.get_base_model().model.layers[0].self_attn.q_proj  # a peft LoRA layer
    base = layer.get_base_layer()
    a, b, s = layer.lora_A["default"].weight, layer.lora_B["default"].weight, layer.scaling["default"]
    x = torch.randn(3, 1, base.in_features, generator=torch.Generator().manual_seed(0))
    run = LowPrecisionKernels(precision).group([layer])
    with torch.no_grad():
        y = run(x, False)[:, 0]  # [3, out]
        x2 = x[:, 0]
        xb = x2.bfloat16().float()  # the activations are rounded to bfloat16 for the kernel
        if precision == "int8":
            q, scale = quantize_rows(base.weight)
            w = q.float() * scale.bfloat16().float()[:, None]
        else:
            w = base.weight.bfloat16().float()
        rounded = (xb @ w.t()).bfloat16().float()  # the kernels return bfloat16
        expected = rounded + s * (x2 @ a.t()) @ b.t()  # the adapter on the unrounded input
        if base.bias is not None:
            expected = expected + base.bias
        full = layer(x2)  # the trainer's float32 function
    torch.testing.assert_close(y, expected, atol=2e-3, rtol=8e-3)  # one bfloat16 rounding apart at most
    assert not torch.allclose(y, full, atol=1e-6)  # a different function than the trainer's


@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_low_precision_sampler_samples_near_the_trainer_and_follows_the_adapter(model_dir, precision):
    policy = lora_policy(model_dir, sampler_precision=precision)
    assert policy.sampler.fast.merged is None  # no folded float32 copy: the adapter runs on top
    plain = lora_policy(model_dir)
    low, full = _draws(policy), _draws(plain)
    gaps = []
    for p, q in zip(low, full, strict=True):  # the same tokens' logprobs, up to where the draws part
        for t, u, x, y in zip(p.token_ids, q.token_ids, p.logprobs, q.logprobs, strict=False):
            if t != u:
                break
            gaps.append(abs(x - y))
    assert gaps[0] < 1e-5  # the first token comes from the float32 prefill
    assert 0 < max(gaps) < 0.2  # the decode steps' do not
    with torch.no_grad():  # an optimizer step's change reaches the next batch, without requantizing
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.mul_(3.0)
    again = _draws(policy)
    assert [c.logprobs for c in again] != [c.logprobs for c in low]


def _gpt2_dir(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=512, n_positions=128)
    GPT2LMHeadModel(config).save_pretrained(tmp_path)
    build_tiny_tokenizer().save_pretrained(tmp_path)
    return tmp_path


def test_a_low_precision_sampler_refuses_a_model_it_cannot_run_with_one_line(tmp_path):
    with pytest.raises(ValueError) as err:
        TransformersPolicy(str(_gpt2_dir(tmp_path)), sampler_precision="int8")
    message = str(err.value)
    assert "\n" not in message
    assert message == (
        'model.sampler_precision = "int8": it samples llama and qwen2 models with full attention, '
        'and this one is gpt2; use "float32"'
    )


def test_the_run_file_check_names_sampler_precision_before_the_weights_load(tmp_path):
    gpt2 = _gpt2_dir(tmp_path / "gpt2")
    config = RunConfig.model_validate(
        {
            "model": {"base_model": str(gpt2), "sampler_precision": "int8"},
            "lora": {"target_modules": ["c_attn"]},
        }
    )
    with pytest.raises(ConfigError) as err:
        check_against_model(config)
    assert str(err.value) == (
        'model.sampler_precision: "int8" samples llama and qwen2 models with full attention, '
        'and this one is gpt2; use "float32"'
    )
    llama = build_tiny_model_dir(tmp_path / "llama")
    off = RunConfig.model_validate(
        {"model": {"base_model": str(llama), "sampler_precision": "bfloat16", "fast": "off"}}
    )
    with pytest.raises(ConfigError, match='model.fast = "off" turns off; use "float32"$'):
        check_against_model(off)
    check_against_model(
        RunConfig.model_validate({"model": {"base_model": str(llama), "sampler_precision": "int8"}})
    )


def test_bfloat16_on_a_cpu_without_it_is_refused_with_one_line(tmp_path):
    llama = build_tiny_model_dir(tmp_path / "llama")
    config = RunConfig.model_validate({"model": {"base_model": str(llama), "sampler_precision": "bfloat16"}})
    if cpu_packs_bfloat16():
        check_against_model(config)  # this CPU runs it
        return
    with pytest.raises(ConfigError) as err:
        check_against_model(config)
    assert str(err.value) == (
        'model.sampler_precision: "bfloat16": it needs oneDNN\'s bfloat16 weights, which need a CPU with AVX512 '
        '(bw, vl, dq) or AVX-NE-CONVERT, and this one has neither; use "float32"'
    )
