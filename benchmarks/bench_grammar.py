"""Grammar libraries for constrained decoding, side by side on SmolLM2's tokenizer (49,152 tokens).

What the sampler pays for a constraint: once per server, the library's view of the tokenizer;
once per request, compiling the grammar; once per sampled token, the mask of allowed tokens
(computing it, and applying it to a [1, V] float32 logits row) and advancing the grammar by the
sampled token. Each library is walked through the same token sequence, a valid JSON document
tokenized as the model would write it, for two grammars: any JSON object (`json_object`) and a
JSON schema with a few typed fields (`json_schema`, strict). Libraries that are not installed
are skipped.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_grammar.py    # all installed libraries
    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_grammar.py --json docs/results/grammar_libraries.json

Without `OMP_WAIT_POLICY=PASSIVE` on a shared machine, the [1, V] masking ops stall on spinning
OpenMP threads (medians of 45 ms instead of 0.05 ms were seen); see bench_generation.py.

Mask times are medians over the walk's tokens, repeated `--repeats` times; compile times are
medians over `--repeats` compiles (llguidance and xgrammar cache nothing across matchers unless
asked; outlines-core builds a full token index per regex, which is its compile cost).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "population": {"type": "integer"},
        "capital": {"type": "boolean"},
        "area_km2": {"type": "number"},
        "languages": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["city", "population", "capital", "area_km2", "languages"],
    "additionalProperties": False,
}
DOCUMENT = {
    "city": "Paris",
    "population": 2102650,
    "capital": True,
    "area_km2": 105.4,
    "languages": ["French", "Breton"],
}
NESTED = {"a": {"b": {"c": {"d": {"e": [1, 2, {"f": "deep"}]}}}}}


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _median_ms(values: list[float]) -> float:
    return 1000 * statistics.median(values)


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer):
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.ll, self.llt = llguidance, llguidance.torch
        start = time.perf_counter()
        self.tok = llguidance.hf.from_tokenizer(tokenizer)
        self.init_s = time.perf_counter() - start
        self.vocab = self.tok.vocab_size
        self.version = _version("llguidance")

    def compile(self, kind: str):
        schema = {"type": "object"} if kind == "json_object" else SCHEMA
        grammar = self.ll.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": True})
        matcher = self.ll.LLMatcher(self.tok, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def mask(self, matcher, mask: torch.Tensor) -> None:
        self.llt.fill_next_token_bitmask(matcher, mask)

    def advance(self, matcher, token: int) -> None:
        assert matcher.consume_token(token), matcher.get_error()

    def done(self, matcher) -> bool:
        return matcher.is_stopped()


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer):
        import xgrammar

        self.xgr = xgrammar
        start = time.perf_counter()
        self.info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
        self.compiler = xgrammar.GrammarCompiler(self.info, cache_enabled=False)
        self.init_s = time.perf_counter() - start
        self.vocab = len(tokenizer)
        self.version = _version("xgrammar")

    def compile(self, kind: str):
        if kind == "json_object":
            compiled = self.compiler.compile_builtin_json_grammar()
        else:
            compiled = self.compiler.compile_json_schema(json.dumps(SCHEMA), strict_mode=True)
        return self.xgr.GrammarMatcher(compiled)

    def mask(self, matcher, mask: torch.Tensor) -> None:
        matcher.fill_next_token_bitmask(mask)

    def advance(self, matcher, token: int) -> None:
        assert matcher.accept_token(token), f"token {token} refused"

    def done(self, matcher) -> bool:
        return matcher.is_terminated()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer):
        import outlines_core

        self.oc = outlines_core
        start = time.perf_counter()
        self.vocabulary = _outlines_vocabulary(outlines_core, tokenizer)
        self.init_s = time.perf_counter() - start
        self.vocab = len(tokenizer)
        self.version = _version("outlines_core")

    def compile(self, kind: str):
        from outlines_core.json_schema import build_regex_from_schema

        schema = {"type": "object"} if kind == "json_object" else SCHEMA
        regex = build_regex_from_schema(json.dumps(schema), r"[ \n]?")
        return self.oc.Guide(self.oc.Index(regex, self.vocabulary))

    def mask(self, guide, mask: torch.Tensor) -> None:
        guide.write_mask_into(mask.data_ptr(), mask.numel(), mask.element_size())

    def advance(self, guide, token: int) -> None:
        guide.advance(token)

    def done(self, guide) -> bool:
        return guide.is_finished()


def walk(lib, matcher, tokens: list[int], logits: torch.Tensor) -> tuple[list[float], list[float]]:
    """Follow `tokens` through the grammar: (mask + advance seconds, apply seconds) per token."""
    mask = torch.full((1, (lib.vocab + 31) // 32), -1, dtype=torch.int32)
    fill, apply = [], []
    for t in tokens:
        a = time.perf_counter()
        lib.mask(matcher, mask)
        b = time.perf_counter()
        row = logits.clone()
        _apply_bitmask(row, mask)
        c = time.perf_counter()
        assert row[0, t] > float("-inf"), f"token {t} masked"
        lib.advance(matcher, t)
        fill.append(b - a + (time.perf_counter() - c))
        apply.append(c - b)
    return fill, apply


@torch.no_grad()
def model_walk(
    lib, matcher, model, prompt_ids: list[int], eos: int, max_tokens: int
) -> tuple[list[float], list[int]]:
    """Greedy decoding of the real model under the grammar: mask + advance seconds per token, and the tokens."""
    mask = torch.full((1, (lib.vocab + 31) // 32), -1, dtype=torch.int32)
    out = model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
    cache, logits = out.past_key_values, out.logits[:, -1].float()
    seconds, tokens = [], []
    for _ in range(max_tokens):
        a = time.perf_counter()
        lib.mask(matcher, mask)
        seconds.append(time.perf_counter() - a)
        row = logits[:, : lib.vocab].clone()
        _apply_bitmask(row, mask)
        token = int(row.argmax())
        tokens.append(token)
        if token == eos:
            break
        a = time.perf_counter()
        lib.advance(matcher, token)
        seconds[-1] += time.perf_counter() - a
        if lib.done(matcher):
            break
        out = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1].float()
    return seconds, tokens


def _outlines_vocabulary(outlines_core, tokenizer):
    """outlines-core wants each token's bytes: undo byte-level BPE's byte-to-character mapping."""
    decoder = {c: b for b, c in _bytes_to_unicode().items()}
    eos = tokenizer.eos_token_id
    special = set(tokenizer.all_special_ids)
    table: dict[bytes, list[int]] = {}
    for token, tid in tokenizer.get_vocab().items():
        if tid in special:
            continue
        raw = bytes(decoder[c] for c in token) if all(c in decoder for c in token) else token.encode()
        table.setdefault(raw, []).append(tid)
    return outlines_core.Vocabulary(eos, table)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level BPE alphabet: each byte as the printable character its tokens spell it with."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def _apply_bitmask(logits: torch.Tensor, mask: torch.Tensor) -> None:
    """The same masking for every library (their own kernels are torch.compile'd for GPUs): bits -> bool -> fill."""
    bits = torch.arange(32, dtype=torch.int32)
    allowed = ((mask[:, :, None] >> bits) & 1).bool().reshape(mask.shape[0], -1)[:, : logits.shape[1]]
    logits.masked_fill_(~allowed, float("-inf"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=96, help="tokens of the greedy walk under each grammar")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grooves.models import resolve_model

    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    questions = {
        "json_object": "Describe Paris as a JSON object with nested details.",
        "json_schema": "Give the city, population, capital, area and languages of Paris as JSON.",
    }
    walks = {
        "json_object": tokenizer(json.dumps(NESTED), add_special_tokens=False)["input_ids"],
        "json_schema": tokenizer(json.dumps(DOCUMENT), add_special_tokens=False)["input_ids"],
    }
    logits = torch.randn(1, len(tokenizer))
    results = []
    for cls in (Llguidance, Xgrammar, OutlinesCore):
        try:
            lib = cls(tokenizer)
        except ImportError as exc:
            print(f"{cls.name}: not installed ({exc})")
            continue
        row = {"library": cls.name, "version": lib.version, "tokenizer_init_ms": 1000 * lib.init_s}
        for kind, tokens in walks.items():
            compiles, fills, applies = [], [], []
            error = None
            for _ in range(args.repeats):
                try:
                    start = time.perf_counter()
                    matcher = lib.compile(kind)
                    compiles.append(time.perf_counter() - start)
                    fill, apply = walk(lib, matcher, tokens, logits)
                except (AssertionError, ValueError, RuntimeError) as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    break
                fills += fill
                applies += apply
            if error is not None:
                row[kind] = {"error": error[:300]}
            else:
                row[kind] = {
                    "tokens": len(tokens),
                    "compile_ms": _median_ms(compiles),
                    "mask_and_advance_ms": _median_ms(fills),
                    "mask_and_advance_p90_ms": 1000 * sorted(fills)[int(0.9 * len(fills))],
                    "mask_and_advance_max_ms": 1000 * max(fills),
                    "apply_ms": _median_ms(applies),
                }
            if error is None:
                prompt = tokenizer.apply_chat_template(
                    [{"role": "user", "content": questions[kind]}],
                    add_generation_prompt=True,
                    tokenize=True,
                    return_dict=True,
                )["input_ids"]
                steps, sampled = model_walk(
                    lib, lib.compile(kind), model, prompt, tokenizer.eos_token_id, args.max_tokens
                )
                row[kind] |= {
                    "model_tokens": len(sampled),
                    "model_mask_and_advance_ms": _median_ms(steps),
                    "model_mask_and_advance_p90_ms": 1000 * sorted(steps)[int(0.9 * len(steps))],
                    "model_mask_and_advance_max_ms": 1000 * max(steps),
                    "model_text": tokenizer.decode(sampled)[:200],
                }
            print(cls.name, kind, row[kind])
        results.append(row)
    report = {
        "vocab": len(tokenizer),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "load_average": os.getloadavg(),
        "cpu": platform.processor() or platform.machine(),
        "results": results,
    }
    print(json.dumps(report, indent=1))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
