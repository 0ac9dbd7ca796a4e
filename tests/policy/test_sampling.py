"""Batched KV-cache sampling: exact logprobs, stopping rules, top-p, seeds."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grooves.policy.sampling import SamplingParams, sample


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _run(model, tok, prompts, params, eos=None, seed=0):
    eos = {tok.eos_token_id} if eos is None else eos
    return sample(
        model, tok, prompts, params, eos_token_ids=eos, generator=torch.Generator().manual_seed(seed)
    )


def _forward_logprobs(model, prompt, tokens, temperature):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0]  # [P+T, V]
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)  # [T, V]
    return logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1), logits[len(prompt) - 1 : -1]


def test_mixed_lengths_and_temperatures_match_a_forward_pass(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompts = [
        _ids(tok, "hi"),
        _ids(tok, "The quick brown fox jumps over the lazy dog."),
        _ids(tok, "0 1 2 3"),
    ]
    params = [
        SamplingParams(n=4, max_tokens=18, temperature=0.6),
        SamplingParams(n=1, max_tokens=7, temperature=1.7),
        SamplingParams(n=3, max_tokens=25, temperature=1.0),
    ]
    results = _run(model, tok, prompts, params)
    assert [len(r) for r in results] == [4, 1, 3]
    for prompt, p, completions in zip(prompts, params, results, strict=True):
        for c in completions:
            assert len(c.token_ids) == len(c.logprobs) <= p.max_tokens
            expected, _ = _forward_logprobs(model, prompt, c.token_ids, p.temperature)
            assert (torch.tensor(c.logprobs) - expected).abs().max().item() < 1e-4


def test_batching_with_longer_prompts_does_not_change_greedy_output(model_and_tokenizer):
    model, tok = model_and_tokenizer
    short = _ids(tok, "yes")
    greedy = SamplingParams(max_tokens=20, temperature=0.0)
    alone = _run(model, tok, [short], [greedy])[0][0]
    batched = _run(
        model,
        tok,
        [_ids(tok, "You are a helpful assistant. Answer the question."), short],
        [SamplingParams(n=5, max_tokens=3), greedy],
    )[1][0]
    assert batched.token_ids == alone.token_ids
    _, logits = _forward_logprobs(model, short, alone.token_ids, 1.0)
    assert logits.argmax(-1).tolist() == alone.token_ids


def test_max_tokens_ends_with_length(model_and_tokenizer):
    model, tok = model_and_tokenizer
    c = _run(model, tok, [_ids(tok, "hello")], [SamplingParams(max_tokens=5, temperature=0.0)], eos=set())[0][
        0
    ]
    assert len(c.token_ids) == 5
    assert c.finish_reason == "length"


def test_eos_stops_the_row_and_is_kept_in_token_ids_but_not_text(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompt = _ids(tok, "hello")
    free = _run(model, tok, [prompt], [SamplingParams(max_tokens=6, temperature=0.0)], eos=set())[0][0]
    stop_at = free.token_ids[2]  # declare the third greedy token an end-of-sequence token
    c = _run(model, tok, [prompt], [SamplingParams(max_tokens=6, temperature=0.0)], eos={stop_at})[0][0]
    first = free.token_ids.index(stop_at)
    assert c.token_ids == free.token_ids[: first + 1]
    assert c.finish_reason == "stop"
    assert c.text == tok.decode(free.token_ids[:first], skip_special_tokens=True)


def test_stop_string_ends_the_row_and_is_cut_from_text(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompt = _ids(tok, "story")
    free = _run(model, tok, [prompt], [SamplingParams(max_tokens=20, temperature=0.0)], eos=set())[0][0]
    k = next(i for i in range(4, 20) if tok.decode(free.token_ids[i - 1 : i]).strip())
    stop = tok.decode(free.token_ids[k - 1 : k])  # the text of the k-th greedy token
    c = _run(model, tok, [prompt], [SamplingParams(max_tokens=20, temperature=0.0, stop=[stop])], eos=set())[
        0
    ][0]
    full_text = tok.decode(free.token_ids)
    assert c.finish_reason == "stop"
    assert c.text == full_text[: full_text.find(stop)]
    assert c.token_ids == free.token_ids[: len(c.token_ids)] and len(c.token_ids) <= k


def test_tiny_top_p_samples_the_argmax_but_reports_full_distribution_logprobs(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompt = _ids(tok, "title")
    c = _run(
        model, tok, [prompt], [SamplingParams(n=3, max_tokens=10, temperature=1.3, top_p=1e-6)], eos=set()
    )[0]
    greedy = _run(model, tok, [prompt], [SamplingParams(max_tokens=10, temperature=0.0)], eos=set())[0][0]
    for row in c:
        assert row.token_ids == greedy.token_ids
        expected, _ = _forward_logprobs(model, prompt, row.token_ids, 1.3)
        assert (torch.tensor(row.logprobs) - expected).abs().max().item() < 1e-4
        assert max(row.logprobs) < 0  # not the truncated distribution, where the kept token has logprob 0


def test_same_seed_same_samples_and_n_rows_differ(model_and_tokenizer):
    model, tok = model_and_tokenizer
    prompt, p = _ids(tok, "hello world"), SamplingParams(n=8, max_tokens=12, temperature=1.0)
    a = _run(model, tok, [prompt], [p], seed=7)[0]
    b = _run(model, tok, [prompt], [p], seed=7)[0]
    other = _run(model, tok, [prompt], [p], seed=8)[0]
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert [x.token_ids for x in a] != [x.token_ids for x in other]
    assert len({tuple(x.token_ids) for x in a}) > 1


def test_prompts_and_params_must_pair_up(model_and_tokenizer):
    model, tok = model_and_tokenizer
    with pytest.raises(ValueError, match="same length"):
        _run(model, tok, [[1, 2], [3]], [SamplingParams()])


def test_draws_follow_the_softmax_at_the_temperature_and_never_pick_a_zero_probability_token():
    from grooves.policy.sampling import _Row, _sample_rows

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, float("-inf")])
    draws = 20_000
    rows = [_Row(request=0, temperature=0.5, top_p=1.0, max_tokens=1, stop=[]) for _ in range(draws)]
    tokens, logps, _ = _sample_rows(logits.expand(draws, -1).clone(), rows, torch.Generator().manual_seed(0))
    expected = torch.softmax(logits / 0.5, dim=-1)  # [0.865, 0.117, 0.0158, 0.0021, 0]
    freq = torch.bincount(tokens, minlength=5).double() / draws
    assert freq[4] == 0
    # binomial standard error at 20k draws is <= 0.0036; 4 of them is a test that fails for a wrong sampler
    assert freq.tolist() == pytest.approx(expected.tolist(), abs=4 * 0.0036)
    assert torch.allclose(logps, expected.log()[tokens])


def test_a_draw_at_the_top_of_the_cdf_takes_the_last_token_with_mass():
    from grooves.policy.sampling import _inverse_cdf

    probs = torch.tensor([[0.5, 0.25, 0.25, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0, 0.0]])
    # u = 1 (or u * total rounding up to the total) falls past every token, into the zero-mass tail
    assert _inverse_cdf(probs, torch.ones(2, dtype=torch.float64)).tolist() == [2, 1]
    assert _inverse_cdf(probs, torch.tensor([0.0, 0.0], dtype=torch.float64)).tolist() == [0, 1]
    assert _inverse_cdf(probs, torch.tensor([0.6, 0.99], dtype=torch.float64)).tolist() == [1, 1]


def test_prompts_with_a_long_shared_start_prefill_it_once_and_sample_as_alone(model_and_tokenizer):
    """An environment's system prompt shared by every rollout runs once; the rest of each prompt,
    of any length, runs on top of it: logprobs equal a plain forward's, greedy output equals alone."""
    from grooves.policy.sampling import MIN_SHARED_PREFILL, shared_prefix_length

    model, tok = model_and_tokenizer
    system = _ids(tok, "You are a helpful assistant. Answer the question. " * 4)
    prompts = [
        system + _ids(tok, "yes"),
        system + _ids(tok, "The quick brown fox jumps over the lazy dog."),
        system + _ids(tok, "0 1"),
    ]
    assert shared_prefix_length(prompts) >= MIN_SHARED_PREFILL
    params = [
        SamplingParams(n=3, max_tokens=12, temperature=0.8),
        SamplingParams(n=1, max_tokens=9, temperature=1.3),
        SamplingParams(n=2, max_tokens=14, temperature=0.0),
    ]
    results = _run(model, tok, prompts, params)
    for prompt, p, completions in zip(prompts, params, results, strict=True):
        for c in completions:
            expected, _ = _forward_logprobs(model, prompt, c.token_ids, p.temperature or 1.0)
            assert (torch.tensor(c.logprobs) - expected).abs().max().item() < 1e-4
    alone = _run(model, tok, [prompts[2]], [SamplingParams(max_tokens=14, temperature=0.0)])[0][0]
    assert results[2][0].token_ids == alone.token_ids == results[2][1].token_ids


@pytest.mark.parametrize("shared_start", [False, True], ids=["left-padded", "shared-start"])
def test_a_prefill_in_chunks_samples_what_one_forward_samples(model_and_tokenizer, monkeypatch, shared_start):
    """Long prompts prefill a few columns at a time on the cache of the ones before: the same
    tokens and logprobs as one forward over every column."""
    from grooves.policy import sampling

    model, tok = model_and_tokenizer
    start = _ids(tok, "You are a helpful assistant. Answer the question. " * 4) if shared_start else []
    prompts = [
        start + _ids(tok, "yes"),
        start + _ids(tok, "The quick brown fox jumps over the lazy dog, twice over."),
        start + _ids(tok, "0 1 2"),
    ]
    params = [
        SamplingParams(n=2, max_tokens=10, temperature=0.9),
        SamplingParams(n=1, max_tokens=8, temperature=0.0),
        SamplingParams(n=1, max_tokens=12, temperature=1.2),
    ]
    calls = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(kw["input_ids"].shape), with_kwargs=True
    )
    try:
        whole = _run(model, tok, prompts, params)
        whole_calls, calls[:] = len(calls), []
        monkeypatch.setattr(sampling, "PREFILL_CHUNK_TOKENS", 3 * 4)  # 3 prompts: 4 columns a forward
        chunked = _run(model, tok, prompts, params)
    finally:
        hook.remove()
    rest = max(len(p) for p in prompts) - len(start)  # the columns after the shared start
    chunks = -(-rest // 4)
    assert len(calls) - whole_calls == chunks - 1
    # the shared start once (one row), then the rest 4 columns at a time, then one-token decode steps
    prefill = [tuple(s) for s in calls[: int(shared_start) + chunks]]
    assert prefill == [(1, len(start))] * shared_start + [(3, min(4, rest - 4 * i)) for i in range(chunks)]
    for a, b in zip(whole, chunked, strict=True):
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        for x, y in zip(a, b, strict=True):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


def test_a_top_p_1_row_draws_from_its_whole_distribution_beside_a_top_p_batch_mate(monkeypatch):
    """A seeded top_p = 1 row samples as it does alone when a batch-mate cuts its own distribution
    (top_p < 1) and asks for more top logprobs: the batch-mate's cut reaches no other row, and its
    own cut keeps the smallest prefix reaching its top_p, as before."""
    from grooves.policy import sampling
    from grooves.policy.sampling import _Row, _sample_rows

    vocab = 4096
    # a long tail: float32's running sum of the sorted probabilities passes 1 before its end
    wide = torch.randn(vocab, generator=torch.Generator().manual_seed(0)) * 5  # [V]
    head = torch.full((vocab,), float("-inf"))
    head[:4] = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()  # top_p 0.7 keeps tokens 0 and 1
    seen: list[torch.Tensor] = []  # the probabilities each draw was taken from
    inverse_cdf = sampling._inverse_cdf
    monkeypatch.setattr(sampling, "_inverse_cdf", lambda p, u: seen.append(p.clone()) or inverse_cdf(p, u))

    def own(seed: int) -> _Row:
        g = torch.Generator().manual_seed(seed)
        return _Row(request=0, temperature=1.0, top_p=1.0, max_tokens=1, stop=[], generator=g, top_k=2)

    mate = _Row(request=1, temperature=1.0, top_p=0.7, max_tokens=1, stop=[], top_k=5)
    for seed in range(16):
        alone = _sample_rows(wide[None].clone(), [own(seed)], torch.Generator().manual_seed(1))
        beside = _sample_rows(torch.stack([wide, head]), [own(seed), mate], torch.Generator().manual_seed(2))
        assert beside[0][0].item() == alone[0][0].item()
        assert beside[1][0].item() == pytest.approx(alone[1][0].item(), abs=1e-6)
        assert beside[2] is not None and alone[2] is not None
        assert [t for t, _ in beside[2][0]] == [t for t, _ in alone[2][0]]
        assert [v for _, v in beside[2][0]] == pytest.approx([v for _, v in alone[2][0]], abs=1e-6)
        assert len(beside[2][1]) == 5
        assert beside[1][1].item() == pytest.approx(
            torch.tensor([0.5, 0.3, 0.15, 0.05])[beside[0][1]].log().item()
        )
        assert beside[0][1].item() in (0, 1)
    # what the draws were taken from: the top_p = 1 row whole, the batch-mate's row cut to 2 tokens
    for probs in seen:
        assert bool((probs[0] > 0).all())
        assert probs[0].double().sum().item() == pytest.approx(1.0, abs=1e-5)
    assert seen[-1][1, :4].tolist() == pytest.approx([0.5, 0.3, 0.0, 0.0], abs=1e-6)
    assert int((seen[-1][1] > 0).sum()) == 2


def test_a_seeded_top_p_1_request_samples_the_same_beside_a_top_p_or_a_plain_batch_mate(model_and_tokenizer):
    """The same batch twice, once with a batch-mate at top_p = 0.6 asking for top logprobs and once
    with a plain one: the seeded top_p = 1 request draws the same tokens, with a plain forward's
    logprobs. (The batches have the same rows at every step, so only the batch-mate's settings differ.)"""
    model, tok = model_and_tokenizer
    prompt, other = _ids(tok, "hello world"), _ids(tok, "The quick brown fox")
    mine = SamplingParams(n=8, max_tokens=16, temperature=1.0, seed=11)
    plain = _run(model, tok, [prompt, other], [mine, SamplingParams(n=2, max_tokens=16, seed=5)], eos=set())
    cut = _run(
        model,
        tok,
        [prompt, other],
        [mine, SamplingParams(n=2, max_tokens=16, seed=5, top_p=0.6, top_logprobs=4)],
        eos=set(),
    )
    assert [c.token_ids for c in cut[0]] == [c.token_ids for c in plain[0]]
    for c in cut[0]:
        expected, _ = _forward_logprobs(model, prompt, c.token_ids, 1.0)
        assert (torch.tensor(c.logprobs) - expected).abs().max().item() < 1e-4
    assert all(len(t) == 4 for c in cut[1] for t in c.top_logprobs or [])
