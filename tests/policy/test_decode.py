"""The sampler's own decode forward draws what transformers' forward draws, for every weight layout."""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch

from grooves.config import LoraConfig
from grooves.policy import sampling
from grooves.policy.fast import FastPaths
from grooves.policy.fast.decode import FusedDecode, FusedPrefill, MatmulPlan, _blocks_of, decoder_for
from grooves.policy.sampling import SamplingParams, TransformersDecode, sample
from grooves.policy.transformers import TransformersPolicy
from tiny_models import build_tiny_model_dir


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_dir(request, tmp_path_factory):
    return build_tiny_model_dir(
        tmp_path_factory.mktemp(request.param), architecture=request.param, init_std=0.2
    )


def _policy(model_dir, **kwargs) -> TransformersPolicy:
    policy = TransformersPolicy(str(model_dir), lora=LoraConfig(rank=4, alpha=8), seed=0, **kwargs)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero; a nonzero adapter must show in the draws
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return policy


def _prompts(policy) -> list[list[int]]:
    # different lengths: the batch is left-padded, which the decoder must mask
    texts = ["hi", "a much longer question about the weather in Paris today"]
    return [policy.prompts.render([{"role": "user", "content": t}], None) for t in texts]


# rows finish at different steps (different max_tokens, and eos), so the batch shrinks as it decodes
PARAMS = [SamplingParams(n=3, max_tokens=9, seed=5), SamplingParams(n=2, max_tokens=15, seed=9)]


def _draws(policy, prompts, *, fused, plan=None, params=PARAMS):
    decoder = functools.partial(decoder_for, fused=fused, plan=plan)
    out = sample(
        policy.model,
        policy.tokenizer,
        prompts,
        params,
        eos_token_ids=policy.prompts.eos_token_ids,
        decoder=decoder,
    )
    return [c for per_prompt in out for c in per_prompt]


def _assert_same(a, b, tol=1e-5):
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    for x, y in zip(a, b, strict=True):
        assert x.logprobs == pytest.approx(y.logprobs, abs=tol)
    assert len({len(c.token_ids) for c in a}) > 1  # rows did leave the batch at different steps


def test_fused_decode_on_folded_weights_matches_transformers_forward(model_dir):
    policy = _policy(model_dir)
    prompts = _prompts(policy)
    with policy.sampler.fast.merged.applied():
        blocks = _blocks_of(policy.model)
        # the folded q/k/v and gate/up weights lie back to back, so each group runs as one matmul
        assert all(b.qkv.fused is not None and b.gate_up.fused is not None for b in blocks)
        assert all(b.o.fused is not None and b.down.fused is not None for b in blocks)
        fused = _draws(policy, prompts, fused=True)
        plain = _draws(policy, prompts, fused=False)
    _assert_same(fused, plain)
    # and the policy's own sampling takes that path with the same result
    policy.generator.manual_seed(0)
    assert [c.token_ids for per in policy.generate(prompts, PARAMS) for c in per] == [
        c.token_ids for c in fused
    ]


class _LinearCalls:
    """Counts the forwards of `nn.Linear` modules (peft's LoRA layers included) while counting."""

    def __init__(self):
        self.n = 0

    @contextlib.contextmanager
    def counting(self):
        self.n = 0

        def hook(module, args, output):
            if isinstance(module, torch.nn.Linear) or hasattr(module, "base_layer"):
                self.n += 1

        handle = torch.nn.modules.module.register_module_forward_hook(hook)
        try:
            yield
        finally:
            handle.remove()


@pytest.mark.parametrize("chunk_tokens", [None, 12], ids=["one-forward", "chunked"])
@pytest.mark.parametrize("shared_start", [False, True], ids=["padded", "shared-start"])
def test_the_fused_prefill_on_packed_weights_matches_transformers_forward(
    model_dir, monkeypatch, shared_start, chunk_tokens
):
    policy = _policy(model_dir)
    prompts = _prompts(policy)  # two lengths: left padding
    if shared_start:  # a start of at least MIN_SHARED_PREFILL tokens runs once as one row
        start = (prompts[1] * 4)[: sampling.MIN_SHARED_PREFILL + 4]
        prompts = [start + prompts[0][-2:], start + prompts[1][-7:]]
    if chunk_tokens is not None:  # 2 prompts: the rests run a few columns a forward, on the cache
        monkeypatch.setattr(sampling, "PREFILL_CHUNK_TOKENS", chunk_tokens)
    pad = policy.tokenizer.pad_token_id or 0
    linear_calls = _LinearCalls()
    with torch.no_grad(), policy.sampler.fast.merged.applied():
        forward = policy.sampler.fast.prefill(policy.model)
        assert isinstance(forward, FusedPrefill)
        with linear_calls.counting():
            cache, logits, mask = sampling._prefill(forward, prompts, pad, "cpu")
        fused_calls = linear_calls.n
        with linear_calls.counting():
            want_cache, want_logits, want_mask = sampling._prefill(policy.model, prompts, pad, "cpu")
    # the fused prefill ran every projection on the packed kernels, never a module of transformers'
    # forward (which the reference runs through its nn.Linear layers): shown by what ran, not by rounding
    assert fused_calls == 0 and linear_calls.n > 0
    assert torch.equal(mask, want_mask)
    assert torch.allclose(logits, want_logits, atol=1e-4)
    real = mask.bool()[:, None, :, None]  # what padding holds is never read
    assert len(cache.layers) == len(want_cache.layers)
    for got, want in zip(cache.layers, want_cache.layers, strict=True):
        assert got.keys.shape == want.keys.shape
        assert torch.allclose(got.keys * real, want.keys * real, atol=1e-4)
        assert torch.allclose(got.values * real, want.values * real, atol=1e-4)


def test_the_decode_steps_run_on_the_blocks_the_fused_prefill_read(model_dir, monkeypatch):
    from grooves.policy.fast import decode

    policy = _policy(model_dir)
    reads = []
    monkeypatch.setattr(
        decode, "_blocks_of", lambda *a, _read=decode._blocks_of: reads.append(1) or _read(*a)
    )
    policy.generate(_prompts(policy), PARAMS)
    assert len(reads) == 1  # the prefill's; the decoder takes them over
    sample(  # a batch without the fused prefill reads them itself
        policy.model,
        policy.tokenizer,
        _prompts(policy),
        PARAMS,
        eos_token_ids=policy.prompts.eos_token_ids,
        decoder=policy.sampler.fast.decoder,
    )
    assert len(reads) == 2


def test_only_the_packed_kernels_get_the_fused_prefill(model_dir):
    assert _policy(model_dir, fast=FastPaths(packed_decode=False)).sampler.fast.prefill(None) is None
    assert _policy(model_dir, fast="off").sampler.fast.prefill(None) is None


def test_both_matmul_forms_decode_the_same(model_dir):
    policy = _policy(model_dir)
    prompts = _prompts(policy)
    forms = {}
    for transposed in (False, True):
        plan = MatmulPlan()
        plan.fix(dict.fromkeys(range(1, 64), transposed))
        with policy.sampler.fast.merged.applied():
            forms[transposed] = _draws(policy, prompts, fused=True, plan=plan)
    _assert_same(forms[True], forms[False])


def test_active_lora_layers_are_called_as_the_modules_they_are(model_dir):
    policy = _policy(
        model_dir, fast=FastPaths(fold_lora=False)
    )  # peft's LoRA layers stay active while sampling
    prompts = _prompts(policy)
    blocks = _blocks_of(policy.model)
    assert all(
        b.qkv.fused is None and all(isinstance(p, torch.nn.Module) for p in b.qkv.parts) for b in blocks
    )
    _assert_same(_draws(policy, prompts, fused=True), _draws(policy, prompts, fused=False))


def test_unpadded_batch_and_base_weights_match_too(model_dir):
    policy = _policy(model_dir)
    prompt = _prompts(policy)[:1] * 2  # one prompt twice: prefilled once, no padding
    params = [SamplingParams(n=2, max_tokens=8, seed=3), SamplingParams(n=2, max_tokens=12, seed=4)]
    with policy.model.disable_adapter():  # the plain base model: separate weights, no fusion
        assert _blocks_of(policy.model)[0].qkv.fused is None
        _assert_same(
            _draws(policy, prompt, fused=True, params=params),
            _draws(policy, prompt, fused=False, params=params),
        )


def test_sliding_window_models_and_fused_false_use_transformers_forward(tmp_path):
    from transformers import AutoModelForCausalLM

    sliding = build_tiny_model_dir(tmp_path / "sliding", architecture="qwen2")
    model = AutoModelForCausalLM.from_pretrained(
        sliding,
        use_sliding_window=True,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
    )
    model.eval()
    assert "sliding_attention" in model.config.layer_types
    ids = torch.tensor([[5, 6, 7]])
    out = model(input_ids=ids, use_cache=True)
    mask = torch.ones_like(ids)
    assert isinstance(decoder_for(model, out.past_key_values, mask, 8), TransformersDecode)

    plain = AutoModelForCausalLM.from_pretrained(build_tiny_model_dir(tmp_path / "plain")).eval()
    out = plain(input_ids=ids, use_cache=True)
    assert isinstance(decoder_for(plain, out.past_key_values, mask, 8), FusedDecode)
    assert isinstance(decoder_for(plain, out.past_key_values, mask, 8, fused=False), TransformersDecode)


def test_a_step_past_the_cache_capacity_is_a_clear_error(tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model_dir(tmp_path)).eval()
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        decode = decoder_for(
            model, model(input_ids=ids, use_cache=True).past_key_values, torch.ones_like(ids), 4
        )
        decode.step(torch.tensor([8]), torch.tensor([3]))
        with pytest.raises(RuntimeError, match="capacity"):
            decode.step(torch.tensor([9]), torch.tensor([4]))


def test_the_plan_times_both_forms_then_keeps_the_clearly_faster():
    plan = MatmulPlan(trials=2, margin=0.9)
    tried = []
    for seconds in ({False: 1.0, True: 0.5}, {False: 0.9, True: 0.6}):  # two rounds of both forms
        for _ in range(2):
            form = plan.form(8)
            tried.append(form)
            plan.record(8, form, seconds[form])
    assert tried == [False, True, False, True]  # alternating while it measures
    assert plan.chosen() == {8: True} and plan.form(8) is True  # 0.5 < 0.9 * 0.9
    plan.record(8, False, 0.01)  # decided once: later steps do not reopen it
    assert plan.form(8) is True

    close = MatmulPlan(trials=1, margin=0.9)
    for form, seconds in ((False, 1.0), (True, 0.95)):
        assert close.form(4) is form
        close.record(4, form, seconds)
    assert close.chosen() == {4: False}  # within the margin: the usual form stays


@pytest.mark.parametrize(
    "fast,blocks_timed,head_timed",
    [
        ("on", False, False),
        ("timed", False, True),
        ("off", False, False),
        (FastPaths(timed_head=True, timed_blocks=True), True, True),
    ],
    ids=["on", "timed", "off", "timed-blocks"],
)
def test_each_fast_setting_times_only_what_it_says(model_dir, fast, blocks_timed, head_timed):
    policy = _policy(model_dir, fast=fast)
    head = policy.model.get_output_embeddings()
    policy.generate(_prompts(policy), PARAMS)
    assert policy.model.get_output_embeddings() is head  # swapped back after sampling, if swapped at all
    assert (policy.sampler.fast.plan is not None and policy.sampler.fast.plan.timed()) is blocks_timed
    head_plan = policy.sampler.fast.head.plan if policy.sampler.fast.head is not None else None
    assert (head_plan is not None and bool(head_plan.chosen())) is head_timed


@pytest.mark.parametrize(
    "dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["float32", "bfloat16"]
)
def test_greedy_steps_give_transformers_logprobs_in_each_dtype(model_dir, dtype, tol):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    ids = torch.randint(0, 400, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # one left-padded row
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    runs = {}
    with torch.no_grad():
        for fused in (True, False):
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
            decode = decoder_for(model, out.past_key_values, mask, 12, fused=fused)
            assert isinstance(decode, FusedDecode if fused else TransformersDecode)
            tokens, pos, steps = torch.tensor([5, 6, 7]), positions[:, -1] + 1, []
            for _ in range(6):
                logits = decode.step(tokens, pos)
                steps.append(logits.log_softmax(-1))
                tokens, pos = logits.argmax(-1), pos + 1
            runs[fused] = torch.stack(steps)  # [steps, R, V]
    assert torch.allclose(runs[True], runs[False], atol=tol)


def test_the_fused_decoder_empties_the_prefills_cache_as_it_copies_it(model_dir):
    """On long chats each copy of the cache is gigabytes: the prefill's is emptied layer by layer
    as the decoder copies it, and the decoder's copy holds what it held."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, 400, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        cache = model(input_ids=ids, attention_mask=mask, use_cache=True).past_key_values
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    decode = decoder_for(model, cache, mask, 9)
    assert isinstance(decode, FusedDecode)
    assert all(layer.keys.numel() == layer.values.numel() == 0 for layer in cache.layers)
    for (k, v), keys, values in zip(before, decode.keys, decode.values, strict=True):
        assert torch.equal(keys[:, :, :5], k) and torch.equal(values[:, :, :5], v)
