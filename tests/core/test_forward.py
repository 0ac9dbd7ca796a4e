"""Token logprobs on the tiny model: packed == padded == a naive per-sequence forward."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from grooves.core.forward import target_logprobs, token_logprobs
from grooves.core.loss import compute_loss
from grooves.core.tokenize import TrainSequence, pack_batches, pad_batch

LENGTHS = [7, 12, 5, 9]


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request, tiny_model_dir):
    m = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, attn_implementation=request.param, dtype=torch.float32
    )
    return m.eval()


def _sequences(vocab: int) -> list[TrainSequence]:
    g = torch.Generator().manual_seed(1)
    seqs = []
    for k, n in enumerate(LENGTHS):
        ids = torch.randint(3, vocab, (n,), generator=g).tolist()
        mask = [i >= 3 for i in range(n)]
        old = [-1.0 - 0.1 * i if m else 0.0 for i, m in enumerate(mask)]
        seqs.append(
            TrainSequence(ids, mask, old, advantage=[1.0, -1.0, 0.5, -0.5][k], group_id=0, prompt_len=3)
        )
    return seqs


def _naive(model, ids: list[int], temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Full forward of one sequence alone: lp[t] = log_softmax(logits[t-1] / T)[ids[t]]."""
    x = torch.tensor([ids])
    logp = torch.log_softmax(model(input_ids=x).logits[0].float() / temperature, dim=-1)  # [T, V]
    lp = torch.zeros(len(ids))
    ent = torch.zeros(len(ids))
    for t in range(1, len(ids)):
        lp[t] = logp[t - 1, ids[t]]
        ent[t] = -(logp[t - 1].exp() * logp[t - 1]).sum()
    return lp, ent


def _per_sequence(batch, values: torch.Tensor) -> dict[int, torch.Tensor]:
    """Split a [B, T] tensor back into each input sequence's values, keyed by input position."""
    return {src: values[batch.seq_ids == k] for k, src in enumerate(batch.sequence_index)}


@torch.no_grad()
def test_padded_and_packed_match_naive(model):
    seqs = _sequences(model.config.vocab_size)
    naive = [_naive(model, s.input_ids) for s in seqs]
    padded = pad_batch(seqs)
    lp_pad, ent_pad = token_logprobs(model, padded)
    packed = pack_batches(seqs, max_tokens=20)
    assert any(b.num_sequences > 1 for b in packed)
    for batch, (lp, ent) in [(padded, (lp_pad, ent_pad))] + [(b, token_logprobs(model, b)) for b in packed]:
        assert lp.shape == batch.input_ids.shape and lp.dtype == torch.float32
        lps, ents = _per_sequence(batch, lp), _per_sequence(batch, ent)
        for src, (lp_ref, ent_ref) in enumerate(naive):
            if src in lps:
                assert (lps[src] - lp_ref).abs().max() < 1e-5
                assert (ents[src] - ent_ref).abs().max() < 1e-5
                assert lps[src][0] == 0 and ents[src][0] == 0


@torch.no_grad()
def test_temperature_and_chunking(model):
    seqs = _sequences(model.config.vocab_size)
    batch = pack_batches(seqs, max_tokens=40)[0]
    lp_small, _ = token_logprobs(model, batch, temperature=0.7, chunk_size=3)
    lp_big, _ = token_logprobs(model, batch, temperature=0.7, chunk_size=4096)
    assert (lp_small - lp_big).abs().max() < 1e-6
    lps = _per_sequence(batch, lp_small)
    for src, s in enumerate(seqs):
        assert (lps[src] - _naive(model, s.input_ids, temperature=0.7)[0]).abs().max() < 1e-5
    with pytest.raises(ValueError, match="temperature must be finite and > 0"):
        token_logprobs(model, batch, temperature=0.0)


def _with_temperatures(seqs: list[TrainSequence], per_sequence: list[list[float]]) -> list[TrainSequence]:
    """Each sequence's sampled tokens at the given temperatures, in turn: as if its turns were sampled at them."""
    out = []
    for s, temps in zip(seqs, per_sequence, strict=True):
        sampled = [i for i, m in enumerate(s.sampled_mask) if m]
        t = [1.0] * len(s)
        for k, i in enumerate(sampled):
            t[i] = temps[k * len(temps) // len(sampled)]
        out.append(dataclasses.replace(s, temperatures=t))
    return out


@torch.no_grad()
def test_each_token_is_read_at_its_own_temperature(model):
    """lp[t] = log_softmax(logits[t-1] / T_t)[ids[t]] with T_t from the batch, in padded and packed batches."""
    seqs = _with_temperatures(
        _sequences(model.config.vocab_size), [[0.5], [0.5, 1.3], [1.0], [0.7, 1.0, 2.0]]
    )
    for batch in [pad_batch(seqs), *pack_batches(seqs, max_tokens=20)]:
        lps = _per_sequence(batch, token_logprobs(model, batch)[0])
        for src in batch.sequence_index:
            s = seqs[src]
            expected = torch.zeros(len(s))
            for temp in set(s.temperatures):
                at = torch.tensor([t == temp for t in s.temperatures])  # [T]
                expected[at] = _naive(model, s.input_ids, temperature=temp)[0][at]
            assert (lps[src] - expected).abs().max() < 1e-5, src
    with pytest.raises(ValueError, match="temperatures must be finite and > 0"):
        dataclasses.replace(seqs[0], temperatures=[0.0] * len(seqs[0]))


def test_chunked_gradient_matches_naive(model):
    seqs = _sequences(model.config.vocab_size)[:2]
    weight = model.get_input_embeddings().weight
    model.zero_grad()
    lp, _ = token_logprobs(model, pack_batches(seqs, max_tokens=40)[0], chunk_size=4)
    lp.sum().backward()
    grad = weight.grad.clone()
    model.zero_grad()
    sum(_naive(model, s.input_ids)[0].sum() for s in seqs).backward()
    assert grad.abs().max() > 0
    assert (grad - weight.grad).abs().max() < 1e-5
    model.zero_grad()


@pytest.mark.parametrize("policy_loss", ["ppo", "gspo"])
def test_pad_and_pack_give_the_same_model_loss(model, policy_loss):
    seqs = _sequences(model.config.vocab_size)
    padded = pad_batch(seqs)

    def loss_of(batch, num_sequences, num_tokens):
        lp, _ = token_logprobs(model, batch)
        loss, _ = compute_loss(
            lp,
            batch.old_logprobs,
            batch.advantages,
            batch.sampled_mask,
            batch.seq_ids,
            policy_loss=policy_loss,
            eps_low=0.2,
            eps_high=0.28,
            aggregation="sequence_mean",
            max_completion_tokens=12,
            num_sequences=num_sequences,
            num_tokens=num_tokens,
        )
        return loss.item()

    with torch.no_grad():
        whole = loss_of(padded, None, None)
        split = sum(
            loss_of(b, padded.num_sequences, padded.num_sampled_tokens) for b in pack_batches(seqs, 20)
        )
    assert abs(whole - split) < 1e-5


@torch.no_grad()
def test_peft_adapter_and_disabled_reference(tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, attn_implementation="sdpa", dtype=torch.float32
    )
    seqs = _sequences(base.config.vocab_size)
    batch = pack_batches(seqs, max_tokens=20)[0]
    lp_base, _ = token_logprobs(base, batch)
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(base, config)
    lp_adapted, _ = token_logprobs(peft_model, batch)
    with peft_model.disable_adapter():
        lp_ref, _ = token_logprobs(peft_model, batch)
    assert (lp_ref - lp_base).abs().max() < 1e-6
    assert (lp_adapted - lp_base)[batch.sampled_mask].abs().max() > 1e-4


@torch.no_grad()
def test_bf16_model_packed_mask_follows_model_dtype(tiny_model_dir):
    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa", dtype=torch.bfloat16)
    seqs = _sequences(m.config.vocab_size)
    padded_lp, _ = token_logprobs(m, pad_batch(seqs))
    packed = pack_batches(seqs, max_tokens=40)[0]
    packed_lp, _ = token_logprobs(m, packed)
    assert torch.isfinite(packed_lp).all()
    pad = _per_sequence(pad_batch(seqs), padded_lp)
    for src, values in _per_sequence(packed, packed_lp).items():
        assert (values - pad[src]).abs().max() < 0.1


def test_packed_batch_refuses_attention_without_4d_masks(tiny_model_dir):
    m = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa")
    m.config._attn_implementation = "flash_attention_2"
    batch = pack_batches(_sequences(m.config.vocab_size), max_tokens=20)[0]
    with pytest.raises(ValueError, match="packed batches need attn_implementation"):
        token_logprobs(m, batch)


def test_shared_prefix_matches_full_forward_values_and_gradients(tiny_model_dir):
    """Computing a group's prompt once gives the same logprobs and LoRA gradients as B full forwards,
    each row's tokens at their own sampling temperatures."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from grooves.core.forward import shared_prefix_logprobs
    from grooves.core.tokenize import TrainSequence

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa")
    model = get_peft_model(
        base,
        LoraConfig(
            r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
        ),
    )
    prompt = [5, 17, 33, 8, 91, 12]
    seqs = []
    for i, completion in enumerate([[40, 41, 2], [50, 51, 52, 53, 2], [60, 2]]):
        ids = prompt + completion
        mask = [False] * len(prompt) + [True] * len(completion)
        temps = [1.0] * len(prompt) + [[0.5, 1.0, 1.7][i]] * len(completion)
        seqs.append(
            TrainSequence(ids, mask, [0.0] * len(ids), float(i) - 1.0, 0, len(prompt), temperatures=temps)
        )
    batch = pad_batch(seqs)
    assert not bool((batch.temperatures == 1).all())
    params = [p for p in model.parameters() if p.requires_grad]

    def loss_and_grads(fn):
        model.zero_grad()
        lp, ent = fn()
        loss = (lp * batch.advantages * batch.sampled_mask).sum()
        loss.backward()
        return lp.detach(), ent, [p.grad.clone() for p in params]

    lp_full, ent_full, g_full = loss_and_grads(lambda: token_logprobs(model, batch))
    m = batch.sampled_mask
    for packed in (True, False):  # suffixes packed into one row (sdpa/eager) or padded over a repeated cache
        lp_pre, ent_pre, g_pre = loss_and_grads(
            lambda packed=packed: shared_prefix_logprobs(model, batch, len(prompt), pack_suffixes=packed)
        )
        assert (lp_full[m] - lp_pre[m]).abs().max() < 1e-5
        assert (ent_full[m] - ent_pre[m]).abs().max() < 1e-5
        assert max(float((a - b).abs().max()) for a, b in zip(g_full, g_pre, strict=True)) < 1e-5
        assert any(float(g.abs().max()) > 0 for g in g_pre)
        if packed:  # padding is never computed, so it stays 0
            assert float(lp_pre[~batch.attention_mask.bool()].abs().max()) == 0.0
    alike = pad_batch(
        [dataclasses.replace(s, input_ids=prompt + [40] + s.input_ids[len(prompt) + 1 :]) for s in seqs]
    )
    with pytest.raises(
        ValueError, match="the shared prefix holds sampled tokens"
    ):  # each row's first sampled token is 40
        shared_prefix_logprobs(model, alike, len(prompt) + 1)


@pytest.mark.parametrize(
    "temps",
    [None, [1.0, 1.0, 0.5, 2.0, 2.0], [1.0, 0.7, 0.5, 2.0, 2.0]],  # the last: row 0 at two temperatures
    ids=["all-1", "per-row", "one-row-two-temperatures"],
)
def test_target_logprobs_and_their_gradient_are_log_softmax_s(temps):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 7, generator=g, requires_grad=True)  # row 1 and 4 predict nothing
    pred = torch.tensor([0, 0, 2, 3, 3])  # row 0 predicts two tokens, as a shared prompt's last position
    targets = torch.tensor([4, 1, 6, 0, 0])
    weights = torch.randn(5, generator=g)
    t = None if temps is None else torch.tensor(temps)
    lp, entropy = target_logprobs(logits, pred, targets, t, chunk_size=2)
    (lp * weights).sum().backward()
    grad, logits.grad = logits.grad, None
    scaled = logits[pred] / (1.0 if t is None else t[:, None])
    logp = scaled.log_softmax(-1)
    expected = logp[torch.arange(5), targets]
    (expected * weights).sum().backward()
    assert torch.allclose(lp, expected.detach(), atol=1e-6)
    assert torch.allclose(entropy, -(logp.exp() * logp).sum(-1).detach(), atol=1e-6)
    assert torch.allclose(grad, logits.grad, atol=1e-6)
    assert grad[1].abs().max() == 0 and grad[4].abs().max() == 0  # rows that predict nothing


def test_a_target_logprob_by_hand():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # softmax (1/4, 3/4)
    lp, entropy = target_logprobs(logits, torch.tensor([0]), torch.tensor([1]))
    assert lp.item() == pytest.approx(math.log(0.75))
    assert entropy.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))


def test_bfloat16_logits_get_a_bfloat16_gradient_summed_in_float32():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 11, generator=g).to(torch.bfloat16).requires_grad_()
    pred, targets = torch.tensor([0, 0, 3, 5]), torch.tensor([2, 7, 7, 1])
    lp, _ = target_logprobs(logits, pred, targets, chunk_size=4)  # a chunk boundary between rows 3 and 4
    lp.sum().backward()
    exact = logits.detach().float().requires_grad_()
    expected = exact[pred].log_softmax(-1)[torch.arange(4), targets]
    expected.sum().backward()
    assert lp.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16
    assert torch.allclose(lp, expected.detach(), atol=1e-5)
    assert torch.allclose(logits.grad.float(), exact.grad, atol=1e-2)  # one rounding to bfloat16


def test_entropy_of_peaked_rows_matches_a_float64_reference():
    # logits ~ N(0, 30^2) at T = 0.7: most rows put nearly all mass on one token, where
    # logsumexp(z) - sum p z cancels two numbers near max(z) ~ 150 and keeps float32's error of them
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1000, generator=g) * 30  # [M, V]
    temps = torch.full((64,), 0.7)
    pred = torch.arange(64)
    _, entropy = target_logprobs(logits, pred, torch.zeros(64, dtype=torch.long), temps)
    z = logits.double() / 0.7
    reference = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)  # [M]
    assert (entropy.double() - reference).abs().max() < 1e-5


def test_entropy_of_very_peaked_rows_is_within_1e_6_relative_of_a_float64_reference():
    """Logits of scale 100, the runner-up 1 to 20 below the top (2 to 40 at T = 0.5): entropies from
    1e-15 to 5. Taken relative to the row max, every term of -sum p log p is a product of nonnegative
    numbers, so float32 keeps its relative precision; z - logsumexp(z) near 100 cost 1e-5 absolute."""
    g = torch.Generator().manual_seed(0)
    rows, vocab = 128, 2048
    top = 100 + 20 * torch.randn(rows, 1, generator=g)  # [M, 1]
    gap = 1 + 19 * torch.rand(rows, 1, generator=g)  # [M, 1]
    logits = top - gap - 60 * torch.rand(rows, vocab, generator=g)  # [M, V]
    logits[:, 0] = top[:, 0]
    logits = logits.gather(-1, torch.rand(rows, vocab, generator=g).argsort(-1))  # the top anywhere
    temps = torch.tensor([1.0, 0.5]).repeat(rows // 2)  # [M]
    _, entropy = target_logprobs(logits, torch.arange(rows), torch.zeros(rows, dtype=torch.long), temps)
    z = (logits / temps[:, None]).double()  # the float32 logits the entropy is taken of, in float64
    # float64 relative to the max: s = z - max(z) is exact, and log Z = log1p(the mass beside the max)
    # keeps the top token's log p (about -1e-17 on the most peaked rows, whose entropy is 3e-15),
    # which float64's z - logsumexp(z) near 200 rounds to a multiple of 3e-14
    s = z - z.max(-1, keepdim=True).values  # [M, V]
    beside = s.exp().sort(-1).values[:, :-1].sum(-1, keepdim=True)  # [M, 1]: all but the max's exp(0)
    logp = s - torch.log1p(beside)  # [M, V]
    reference = -(logp.exp() * logp).sum(-1)  # [M]
    naive = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)  # right where the entropy is not tiny
    flat = reference > 1e-4
    assert torch.allclose(naive[flat], reference[flat], rtol=1e-7, atol=0.0)
    assert reference.min() < 1e-6 and reference.max() > 1  # very peaked rows and flat ones
    assert ((entropy.double() - reference).abs() / reference).max() < 1e-6
