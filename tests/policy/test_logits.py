"""logit_bias, frequency/presence penalties and top_logprobs in the sampler, against hand computations and a forward pass."""

from __future__ import annotations

import pytest
import torch

from grooves.policy.logits import LogitBias, Penalties, penalized, top_logprobs
from grooves.policy.sampling import SamplingParams, _Row, _sample_rows
from grooves.policy.transformers import TransformersPolicy


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TransformersPolicy(str(tiny_model_dir), served_name="tiny")


def rows(n: int, **kw) -> list[_Row]:
    return [
        _Row(request=0, temperature=kw.pop("temperature", 1.0), top_p=1.0, max_tokens=1, stop=[], **kw)
        for _ in range(n)
    ]


def test_a_minus_100_bias_is_never_sampled_and_plus_100_always_is():
    logits = torch.zeros(2000, 16)  # uniform: without the bias token 3 would come up ~125 times
    banned = rows(2000)
    for r in banned:
        r.hooks = [LogitBias({3: -100.0}, 16)]
    tokens, _, _ = _sample_rows(logits, banned, torch.Generator().manual_seed(0))
    assert 3 not in tokens.tolist()
    assert len(set(tokens.tolist())) == 15
    forced = rows(200)
    for r in forced:
        r.hooks = [LogitBias({7: 100.0}, 16)]
    tokens, logps, _ = _sample_rows(torch.zeros(200, 16), forced, torch.Generator().manual_seed(0))
    assert set(tokens.tolist()) == {7}
    assert logps.abs().max().item() < 1e-30  # log(1 / (1 + 15 e^-100))


def test_the_recorded_logprob_is_that_of_the_biased_distribution():
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0]])
    row = rows(1, temperature=0.5)
    row[0].hooks = [LogitBias({1: -3.0, 3: 2.5}, 4)]
    token, logp, _ = _sample_rows(logits, row, torch.Generator().manual_seed(1))
    expected = torch.log_softmax(torch.tensor([1.0, -1.0, 0.5, 1.5]) / 0.5, dim=-1)[token]
    assert abs(float(logp) - float(expected)) < 1e-6


def test_penalties_follow_openais_formula():
    counts = torch.tensor([0.0, 1.0, 2.0, 0.0])
    assert penalized(torch.zeros(4), counts, 0.5, 0.2).tolist() == pytest.approx([0.0, -0.7, -1.2, 0.0])
    hook = Penalties(0.5, 0.2, 4)
    for token in (1, 2, 2):
        hook.advance(token)
    logits = torch.tensor([0.3, 0.1, 2.0, -0.4])
    hook.apply(logits)
    assert logits.tolist() == pytest.approx([0.3, 0.1 - 0.5 - 0.2, 2.0 - 1.0 - 0.2, -0.4])
    with pytest.raises(ValueError, match=r"frequency_penalty=2.5 is outside \[-2.0, 2.0\]"):
        Penalties(2.5, 0.0, 4)
    with pytest.raises(ValueError, match="logit_bias token 9 is not a token id of this model"):
        LogitBias({9: 1.0}, 4)


def test_penalized_sampling_equals_a_forward_pass_with_the_penalties_applied(policy):
    prompt = policy.prompts.render([{"role": "user", "content": "hello world"}], None)
    params = SamplingParams(
        n=3,
        max_tokens=24,
        temperature=0.9,
        seed=5,
        frequency_penalty=1.5,
        presence_penalty=0.7,
        logit_bias={5: 2.0},
    )
    for c in policy.generate([prompt], [params])[0]:
        with torch.no_grad():
            logits = (
                policy.model(input_ids=torch.tensor([prompt + c.token_ids]))
                .logits[0, len(prompt) - 1 : -1]
                .float()
            )
        counts = torch.zeros(logits.shape[-1])
        expected = []
        for t, tok in enumerate(c.token_ids):  # mu_j - c_j * 1.5 - [c_j > 0] * 0.7, with the bias added first
            z = logits[t].clone()
            z[5] += 2.0
            z = penalized(z, counts, 1.5, 0.7)
            expected.append(float(torch.log_softmax(z / 0.9, dim=-1)[tok]))
            counts[tok] += 1
        assert torch.tensor(c.logprobs).sub(torch.tensor(expected)).abs().max().item() < 1e-4


def test_penalties_change_what_is_sampled(policy):
    prompt = policy.prompts.render([{"role": "user", "content": "yes no"}], None)
    plain = policy.generate([prompt], [SamplingParams(n=4, max_tokens=40, temperature=0, seed=1)])[0][0]
    penalized_run = policy.generate(
        [prompt], [SamplingParams(n=1, max_tokens=40, temperature=0, frequency_penalty=2.0)]
    )[0][0]
    # greedy decoding of a tiny random model repeats itself; the penalty breaks the repetition
    assert len(set(penalized_run.token_ids)) > len(set(plain.token_ids))


def test_top_logprobs_equal_a_forward_passes_top_k(policy):
    prompt = policy.prompts.render([{"role": "user", "content": "a story"}], None)
    for temperature in (0.7, 0.0):
        (c,) = policy.generate(
            [prompt], [SamplingParams(n=1, max_tokens=12, temperature=temperature, seed=3, top_logprobs=5)]
        )[0]
        with torch.no_grad():
            logits = (
                policy.model(input_ids=torch.tensor([prompt + c.token_ids]))
                .logits[0, len(prompt) - 1 : -1]
                .float()
            )
        logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)  # [T, V]
        values, ids = logp.topk(5, dim=-1)
        assert len(c.top_logprobs) == len(c.token_ids)
        for t, alternatives in enumerate(c.top_logprobs):
            assert [i for i, _ in alternatives] == ids[t].tolist()
            assert torch.tensor([v for _, v in alternatives]).sub(values[t]).abs().max().item() < 1e-4
        if temperature == 0:  # greedy: the sampled token is the first alternative
            assert [a[0][0] for a in c.top_logprobs] == c.token_ids


def test_top_logprobs_bounds_and_zero():
    assert top_logprobs(torch.zeros(2, 3), 0) == [[], []]
    with pytest.raises(ValueError, match=r"top_logprobs=21 is outside \[0, 20\]"):
        from grooves.policy.sampling import sample

        sample(None, None, [[1]], [SamplingParams(top_logprobs=21)], eos_token_ids={0})


def test_requests_without_hooks_are_unchanged_by_a_hooked_neighbour(policy):
    prompt = policy.prompts.render([{"role": "user", "content": "hello"}], None)
    plain = SamplingParams(n=2, max_tokens=10, temperature=1.0, seed=11)
    alone = policy.generate([prompt], [plain])[0]
    hooked = SamplingParams(
        n=2,
        max_tokens=10,
        temperature=1.0,
        seed=12,
        logit_bias={4: -100.0},
        presence_penalty=1.0,
        top_logprobs=3,
    )
    together = policy.generate([prompt, prompt], [plain, hooked])
    assert [c.token_ids for c in together[0]] == [c.token_ids for c in alone]
    assert all(c.top_logprobs is None for c in together[0])
    assert all(len(c.top_logprobs) == len(c.token_ids) for c in together[1])
