"""Batched sampling with a KV cache, returning every sampled token's id and logprob.

Why not `model.generate`: we need (1) the logprob of each sampled token under the exact
distribution it was drawn from, (2) one prefill per distinct prompt even when it is sampled n
times (a GRPO group shares its prompt), and (3) several different requests decoded together.

The loop: prefill the distinct prompts once (their long shared start, such as an environment's
system prompt and tool list, once for all of them), repeat each row of the KV cache for its n
samples, then decode one token per step for all rows, dropping finished rows from the cache
so late steps cost only what is still running. Decode steps run through transformers' forward
(`TransformersDecode`) unless the caller passes another decoder: a transformers policy's
`Sampler` (`policy/sampler.py`) passes the fast paths' (`policy/fast/`), a leaner forward for
Llama/Qwen2 models.

Logprobs are `log_softmax(logits / temperature)` at the sampled token: the full distribution at
that temperature, before top-p truncation. The trainer computes the same quantity, so the PPO
ratio compares like with like; with top_p < 1 the sampler draws from a truncated distribution,
which makes training slightly off-policy, so training runs default to top_p = 1.
Each row's top-p cut and top logprobs are its own: a row with top_p = 1 is never cut, and a
seeded row draws from its own generator, so its draws do not depend on its batch-mates' settings.

A row's logits can pass through per-row hooks before the temperature (`policy/logits.py`): the
request's `logit_bias`, its frequency and presence penalties, and a grammar mask for constrained
decoding (`SamplingParams.constraint`, see `policy/constraints.py`). When they do, the recorded
logprob is that of the changed distribution, the one the token was drawn from (masked tokens
have no mass and the rest are renormalized), and `top_logprobs` list that distribution's most
likely tokens. Rows without hooks take the plain path at no extra cost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from grooves.core.forward import kept_positions
from grooves.policy.logits import LogitBias, Penalties, RowLogits, top_logprobs

MAX_TOP_LOGPROBS = 20
"""The most alternatives per token a request may ask for (OpenAI's limit for `top_logprobs`)."""

SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
"""A request's seed is a signed 64-bit integer (as in OpenAI's API); sample k of n uses seed + k,
which torch's generator takes up to 2**64 - 1."""


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    """Added to the logits of these token ids before sampling (OpenAI's `logit_bias`, -100 .. 100)."""
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    """OpenAI's penalties on tokens already sampled in the completion, -2 .. 2 (`logits.penalized`)."""
    top_logprobs: int = 0
    """How many of the most likely tokens to report at each position (0 .. MAX_TOP_LOGPROBS)."""
    constraint: Callable[[], RowLogits] | None = None
    """Makes each sampled row's grammar mask (`policy/constraints.py`); None: unconstrained."""
    on_tokens: Callable[[list[TokenEvent]], None] | None = None
    """Called on the sampling thread after each decode step with the tokens this request's rows
    sampled in it (streaming); it must not block: hand the events to another thread (e.g.
    `loop.call_soon_threadsafe`). One call per step, not per row, keeps the handoffs few."""


@dataclass
class TokenEvent:
    """One sampled token of sample `index` of a request; `completion` is set when it ended that sample."""

    index: int
    token: int
    logprob: float
    top_logprobs: list[tuple[int, float]] | None
    completion: Completion | None


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: (
        str  # "stop" (eos or a stop string) | "length" | "cancelled" (the caller withdrew the request)
    )
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """Per token, the `top_logprobs` most likely (token id, logprob) of its distribution; None when not asked."""


class Decoder(Protocol):
    """Decode steps after a prefill: one token per row in, next-token logits out."""

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...

    def keep(self, index: torch.Tensor) -> None: ...


DecoderFactory = Callable[..., Decoder]
"""`(model, cache, mask [R, P], capacity) -> Decoder`, called once per batch after its prefill;
`capacity` bounds the sequence length (prompt width + the most new tokens any row may take)."""


class TransformersDecode:
    """Decode steps through the model's own forward and a `DynamicCache`."""

    def __init__(self, model, cache, mask: torch.Tensor):
        self.model, self.cache, self.mask = model, cache, mask  # mask [R, P]: 1 = a real token

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (tokens, positions: [R]); returns the next-token logits [R, V] in float32."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(tokens), 1))], dim=1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask,
            position_ids=positions[:, None],
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = out.past_key_values
        return out.logits[:, -1, :].float()

    def keep(self, index: torch.Tensor) -> None:
        """Keep only these rows (finished rows leave the batch)."""
        self.cache.reorder_cache(index)
        self.mask = self.mask[index]


def plain_decoder(model, cache, mask: torch.Tensor, capacity: int) -> TransformersDecode:
    """transformers' forward for every decode step (`capacity` is not needed: its cache grows)."""
    return TransformersDecode(model, cache, mask)


@dataclass
class _Row:
    request: int
    temperature: float
    top_p: float
    max_tokens: int
    stop: list[str]
    generator: torch.Generator | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    hooks: list[RowLogits] = field(default_factory=list)
    """Applied to this row's logits in order before each draw (bias, penalties, grammar mask)."""
    top_k: int = 0
    """`top_logprobs` of the request: alternatives recorded per token."""
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    index: int = 0
    """Which of its request's n samples this row is."""
    on_tokens: Callable[[list[TokenEvent]], None] | None = None


def _hooked(logits: torch.Tensor, rows: list[_Row]) -> torch.Tensor:
    """The logits [R, V] after each row's hooks; the input itself when no row has any."""
    if not any(r.hooks for r in rows):
        return logits
    logits = logits.clone()
    for j, r in enumerate(rows):
        for hook in r.hooks:
            hook.apply(logits[j])
    return logits


def _sample_rows(logits: torch.Tensor, rows: list[_Row], generator: torch.Generator | None):
    """One token per row. logits: [R, V] float32. Returns (tokens [R], logprobs [R], top logprobs or None).

    The top logprobs (a list per row, empty for rows that did not ask) come from the same
    distribution as the logprob: the hooked logits at the row's temperature (1 for greedy rows).
    """
    logits = _hooked(logits, rows)
    device = logits.device
    temps = torch.tensor([max(r.temperature, 1e-5) for r in rows], dtype=logits.dtype, device=device)  # [R]
    greedy = torch.tensor([r.temperature == 0 for r in rows], device=device)  # [R]
    scaled = logits / temps[:, None]  # [R, V]
    logp = torch.log_softmax(scaled, dim=-1)  # [R, V]
    probs = logp.exp()  # [R, V]
    cut = [j for j, r in enumerate(rows) if r.top_p < 1]
    if cut:  # only these rows: a row with top_p = 1 keeps every token whatever its batch-mates ask
        top_ps = torch.tensor([rows[j].top_p for j in cut], dtype=logits.dtype, device=device)  # [C]
        index = torch.tensor(cut, device=device)
        probs[index] = _top_p_cut(probs[index], top_ps)
    # inverse-CDF draws: one uniform per row (from its own generator when seeded, so its draws
    # don't depend on its batch-mates) and one batched search, instead of torch.multinomial's
    # exponential noise over the whole vocabulary for every row. The generators are CPU ones, so a
    # seeded row draws the same number on every device; the uniforms then move to the logits.
    uniforms = torch.empty(len(rows), dtype=torch.float64)
    unseeded = [j for j, r in enumerate(rows) if r.generator is None]
    if unseeded:
        uniforms[unseeded] = torch.rand(len(unseeded), generator=generator, dtype=torch.float64)
    for j, r in enumerate(rows):
        if r.generator is not None:
            uniforms[j] = torch.rand((), generator=r.generator, dtype=torch.float64)
    sampled = _inverse_cdf(probs, uniforms.to(device))
    tokens = sampled
    if bool(greedy.any()):  # greedy rows report the temperature-1 logprob (temperature 0 has no distribution)
        tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
        logp = torch.where(greedy[:, None], torch.log_softmax(logits, dim=-1), logp)
    chosen = logp.gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, chosen, _row_top_logprobs(logp, rows)


def _top_p_cut(probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Each row of probs [C, V] cut to the smallest set of its most likely tokens reaching its top_p [C]."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    cum = sorted_p.cumsum(dim=-1)
    drop = (cum - sorted_p) > top_ps[:, None]  # keep the smallest prefix reaching top_p
    return torch.zeros_like(probs).scatter_(-1, order, sorted_p.masked_fill(drop, 0.0))


def _row_top_logprobs(logp: torch.Tensor, rows: list[_Row]) -> list[list[tuple[int, float]]] | None:
    """Each row's own `top_k` most likely tokens of logp [R, V] (empty for rows that did not ask);
    None when no row asked. Rows are grouped by k, so tied tokens are listed as the row alone lists them."""
    ks = {r.top_k for r in rows if r.top_k > 0}
    if not ks:
        return None
    top: list[list[tuple[int, float]]] = [[] for _ in rows]
    for k in ks:
        same = [j for j, r in enumerate(rows) if r.top_k == k]
        asked = logp if len(same) == len(rows) else logp[torch.tensor(same, device=logp.device)]  # [S, V]
        for j, t in zip(same, top_logprobs(asked, k), strict=True):
            top[j] = t
    return top


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the first token whose cumulative mass exceeds `u * total`. probs [R, V], uniforms [R] float64."""
    cdf = probs.double().cumsum(dim=-1)  # float64 so the tail tokens keep their mass
    token = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True).squeeze(-1)
    vocab = probs.shape[-1]
    token = token.clamp_(max=vocab - 1)
    # u * total rounding up to the total lands past the last token, which may have no mass: take the last that has
    empty = probs.gather(-1, token[:, None]).squeeze(-1) <= 0
    if bool(empty.any()):
        idx = torch.arange(vocab, device=probs.device)
        positive = probs[empty] > 0
        last = torch.where(positive & (idx <= token[empty, None]), idx, -1).amax(dim=-1)
        first = torch.where(positive, idx, vocab).amin(dim=-1)
        token[empty] = torch.where(last >= 0, last, first)
    return token


@torch.no_grad()
def sample(
    model,
    tokenizer,
    prompts: list[list[int]],
    params: list[SamplingParams],
    *,
    eos_token_ids: set[int],
    generator: torch.Generator | None = None,
    decoder: DecoderFactory = plain_decoder,
    prefill: Callable[[Any], Callable[..., Any] | None] | None = None,
    cancelled: Sequence[Callable[[], bool]] | None = None,
) -> list[list[Completion]]:
    """Sample `params[i].n` completions of each prompt; returns one list per prompt.

    `decoder` runs the decode steps after the prefill (default: the model's own forward).
    `prefill(model)` gives the forward the prompts run on, called as the model is (None, or
    None from it: the model itself).
    `cancelled[i]()` is asked before each decode step: once True, prompt i's rows leave the batch
    (and its KV cache) like finished rows, with `finish_reason` "cancelled" and the tokens so far.
    """
    _check_requests(prompts, params, cancelled)
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_token_ids)
    # identical prompts (a group's rollouts sent as separate requests) are prefilled once
    unique: dict[tuple[int, ...], int] = {}
    slot = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
    distinct = [list(p) for p in unique]
    forward = prefill(model) if prefill is not None else None
    cache, last_logits, mask = _prefill(forward or model, distinct, pad_id, device)
    width = mask.shape[1]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [U, W]: padding must not shift positions

    rows, expand = _make_rows(params, slot, vocab=int(last_logits.shape[-1]))
    index = torch.tensor(expand, device=device)
    if expand != list(range(len(distinct))):  # n = 1 of distinct prompts (agent turns) needs no copy
        cache.reorder_cache(index)  # [U, ...] -> [R, ...]: the prefill is shared by the n samples
    logits = last_logits[index]  # [R, V]
    decode = decoder(model, cache, mask[index], width + max((r.max_tokens for r in rows), default=0))
    # the fused decoder emptied the prefill's cache as it copied it; the plain one decodes on it
    del cache, last_logits
    next_pos = positions[index, -1] + 1  # [R]
    active = list(range(len(rows)))

    while active:
        tokens, logps, top = _sample_rows(logits, [rows[a] for a in active], generator)
        drawn = (tokens.tolist(), logps.tolist(), top)  # one device-to-host copy a step
        gone = {i for i, c in enumerate(cancelled) if c()} if cancelled is not None else set()
        still = _take_step(tokenizer, params, [rows[a] for a in active], drawn, gone, eos_token_ids)
        if not still:
            break
        if len(still) < len(active):
            keep = torch.tensor(still, device=device)
            decode.keep(keep)
            next_pos, tokens = next_pos[keep], tokens[keep]
        active = [active[j] for j in still]
        logits = decode.step(tokens, next_pos)
        next_pos = next_pos + 1

    results: list[list[Completion]] = [[] for _ in prompts]
    for row in rows:
        results[row.request].append(_finish(tokenizer, row, eos_token_ids))
    return results


def _check_requests(
    prompts: list[list[int]], params: list[SamplingParams], cancelled: Sequence[Callable[[], bool]] | None
) -> None:
    """Raise a one-line ValueError naming the bad argument or `params[i]` field."""
    if len(prompts) != len(params):
        raise ValueError("prompts and params must have the same length")
    if cancelled is not None and len(cancelled) != len(prompts):
        raise ValueError("cancelled must have one entry per prompt")
    for i, p in enumerate(params):
        if p.seed is not None and not SEED_MIN <= p.seed <= SEED_MAX:
            raise ValueError(
                f"params[{i}].seed={p.seed} is outside [{SEED_MIN}, {SEED_MAX}] (a signed 64-bit integer)"
            )
        if not 0 <= p.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"params[{i}].top_logprobs={p.top_logprobs} is outside [0, {MAX_TOP_LOGPROBS}]")


def _make_rows(params: list[SamplingParams], slot: list[int], *, vocab: int) -> tuple[list[_Row], list[int]]:
    """One row per sample (request i's n rows in order), and for each row its distinct prompt's slot."""
    rows: list[_Row] = []
    expand: list[int] = []
    for i, p in enumerate(params):
        for k in range(p.n):
            g = torch.Generator().manual_seed(p.seed + k) if p.seed is not None else None
            hooks = _row_hooks(p, vocab)
            rows.append(
                _Row(
                    i,
                    p.temperature,
                    p.top_p,
                    p.max_tokens,
                    list(p.stop),
                    g,
                    hooks=hooks,
                    top_k=p.top_logprobs,
                    index=k,
                    on_tokens=p.on_tokens,
                )
            )
            expand.append(slot[i])
    return rows, expand


def _take_step(
    tokenizer,
    params: list[SamplingParams],
    rows: list[_Row],
    drawn: tuple[list[int], list[float], list[list[tuple[int, float]]] | None],
    gone: set[int],
    eos_token_ids: set[int],
) -> list[int]:
    """Append this step's draw (tokens, logprobs, top logprobs: one per row) to the active rows, end the
    rows that stopped or were cancelled, and stream the step to each request's `on_tokens`.
    Returns the positions in `rows` that go on decoding."""
    token_list, logp_list, top = drawn
    still: list[int] = []
    events: dict[int, list[TokenEvent]] = {}  # request -> this step's tokens, for `on_tokens`
    for j, row in enumerate(rows):
        if row.request in gone:
            row.finish = "cancelled"
            continue
        tok = token_list[j]
        row.tokens.append(tok)
        row.logprobs.append(logp_list[j])
        if row.top_k:
            assert top is not None  # drawn with top logprobs whenever a row asks for them
            row.top.append(top[j])
        if tok in eos_token_ids:
            row.finish = "stop"
        elif row.stop and _hits_stop(tokenizer, row):
            row.finish = "stop"
        elif len(row.tokens) >= row.max_tokens:
            row.finish = "length"
        else:
            still.append(j)
            for hook in row.hooks:
                hook.advance(tok)
        if row.on_tokens is not None:
            done = _finish(tokenizer, row, eos_token_ids) if row.finish else None
            events.setdefault(row.request, []).append(
                TokenEvent(row.index, tok, row.logprobs[-1], row.top[-1] if row.top_k else None, done)
            )
    for request, step in events.items():
        on_tokens = params[request].on_tokens
        if on_tokens is not None:  # events are only gathered for rows that stream
            on_tokens(step)
    return still


MIN_SHARED_PREFILL = 32
"""Below this many leading tokens shared by every distinct prompt, one padded prefill is as cheap."""

PREFILL_CHUNK_TOKENS = 4096
"""Prompt tokens (rows x columns) one prefill forward runs at most. A forward's transients (the
attention mask, the MLP's activations) grow with the tokens it runs, and 16 agent chats of 2k
tokens are 32k of them (docs/speed.md, "The sampler's memory on long chats"); at 4k tokens a
forward already runs each weight over thousands of rows."""


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading ids every prompt shares, leaving at least one id of each to prefill on top.

    >>> shared_prefix_length([[5, 6, 7, 8], [5, 6, 9], [5, 6, 7]])
    2
    """
    first = prompts[0]
    n = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        i = 0
        while i < n and p[i] == first[i]:
            i += 1
        n = i
    return max(n, 0)


def _prefill(model, prompts: list[list[int]], pad_id: int, device) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """Run the distinct prompts once; returns (KV cache [U, ...], last-position logits [U, V], mask [U, W]).

    Agent prompts share a long start: an environment's system prompt and tool list is the same for
    every rollout in the batch, and often longer than what follows it (a question, the turns so
    far). That start runs once as one row, its KV cache is repeated for each prompt, and only the
    rest of each prompt runs on top of it, left-padded to the longest rest: the mask is then
    [shared | padding | rest]. Without a long shared start, the prompts are left-padded and run
    as one batch. Either way each prompt's last token sits in the last column, the only one whose
    logits are kept, and positions come from the mask, so padding never shifts them. The rests run
    `PREFILL_CHUNK_TOKENS` at a time, a chunk of columns on the cache of the ones before it: the
    same attention, so the same cache and logits up to float rounding, with a bounded transient.
    """
    shared = shared_prefix_length(prompts) if len(prompts) > 1 else 0
    if shared < MIN_SHARED_PREFILL:
        shared = 0
    rests = [p[shared:] for p in prompts]
    width = max(len(r) for r in rests)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), shared + width), dtype=torch.long)
    mask[:, :shared] = 1
    for i, r in enumerate(rests):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, shared + width - len(r) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    cache = None
    if shared:
        head = torch.tensor([prompts[0][:shared]], device=device)  # [1, S]
        cache = model(
            input_ids=head, use_cache=True, logits_to_keep=kept_positions(shared - 1, shared, device)
        ).past_key_values
        cache.reorder_cache(
            torch.zeros(len(prompts), dtype=torch.long, device=device)
        )  # [1, ...] -> [U, ...]
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]  # [U, width]
    columns = max(1, PREFILL_CHUNK_TOKENS // len(prompts))
    for start in range(0, width, columns):
        end = min(start + columns, width)
        out = model(
            input_ids=ids[:, start:end],
            attention_mask=mask[:, : shared + end],  # the cache's columns and this chunk's
            position_ids=positions[:, start:end],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=kept_positions(end - start - 1, end - start, device),
        )
        cache = out.past_key_values
    return cache, out.logits[:, -1, :].float(), mask


def _row_hooks(p: SamplingParams, vocab: int) -> list[RowLogits]:
    """One row's logits hooks, in the order they apply: bias, penalties, grammar mask."""
    hooks: list[RowLogits] = []
    if p.logit_bias:
        hooks.append(LogitBias(p.logit_bias, vocab))
    if p.frequency_penalty or p.presence_penalty:
        hooks.append(Penalties(p.frequency_penalty, p.presence_penalty, vocab))
    if p.constraint is not None:
        hooks.append(p.constraint())
    return hooks


def _hits_stop(tokenizer, row: _Row) -> bool:
    tail = tokenizer.decode(row.tokens[-16:], skip_special_tokens=False)
    return any(s in tail for s in row.stop)


def _finish(tokenizer, row: _Row, eos_token_ids: set[int]) -> Completion:
    body = row.tokens[:-1] if row.tokens and row.tokens[-1] in eos_token_ids else row.tokens
    text = tokenizer.decode(body, skip_special_tokens=True)
    for s in row.stop:
        cut = text.find(s)
        if cut >= 0:
            text = text[:cut]
    return Completion(
        token_ids=row.tokens,
        logprobs=row.logprobs,
        text=text,
        finish_reason=row.finish or "length",
        top_logprobs=row.top if row.top_k else None,
    )
