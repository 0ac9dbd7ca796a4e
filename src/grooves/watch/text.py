"""Lexical measures on a step's outputs: sameness across inputs, and grounding in the input.

Pure functions over `outputs[g]` (the completions of group g, i.e. of input g) and `inputs[g]`
(the text of input g). Words are lower-cased `\\w+` runs, so "Wow!" and "wow" are the same
word; that makes a duplicate "the same after trivial edits", which is what a collapsed policy
produces. Pairs are only ever taken across *different* inputs: N samples of one prompt may
rightly agree, and that is no collapse.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

_WORD = re.compile(r"\w+")

Pair = tuple[tuple[int, int], tuple[int, int]]
"""((group, index), (group, index)) naming two outputs of different inputs."""


def words(text: str) -> list[str]:
    """Lower-cased word tokens.

    >>> words("Show HN: I built a 3D printer!")
    ['show', 'hn', 'i', 'built', 'a', '3d', 'printer']
    """
    return _WORD.findall(text.lower())


def normalize(text: str) -> str:
    """The text as its words joined by single spaces: the key for exact-duplicate counting."""
    return " ".join(words(text))


def ngrams(tokens: Sequence[str], n: int) -> frozenset[tuple[str, ...]]:
    """Word n-grams; a text shorter than n is its own single gram (so short outputs still compare)."""
    if len(tokens) < n:
        return frozenset([tuple(tokens)]) if tokens else frozenset()
    return frozenset(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
    """|a & b| / |a | b|; two empty sets are identical (1.0): two empty outputs are a duplicate.

    >>> jaccard(frozenset({1, 2, 3}), frozenset({2, 3, 4}))
    0.5
    """
    union = len(a | b)
    return 1.0 if union == 0 else len(a & b) / union


def cross_pairs(sizes: Sequence[int], max_pairs: int, rng: np.random.Generator) -> list[Pair]:
    """Pairs of outputs from different groups: all of them if few, else `max_pairs` sampled.

    Sampling is with replacement over the (group, index) grid, rejecting same-group draws; it is
    unbiased for the mean over all cross pairs, which is what the detectors report.
    """
    index = [(g, i) for g, n in enumerate(sizes) for i in range(n)]
    total = (len(index) ** 2 - sum(n * n for n in sizes)) // 2
    if total <= max_pairs:
        return [(a, b) for k, a in enumerate(index) for b in index[k + 1 :] if a[0] != b[0]]
    group_of = np.array([g for g, _ in index])
    drawn: list[list[int]] = []
    while len(drawn) < max_pairs:
        draw = rng.integers(0, len(index), size=(2 * max_pairs, 2))  # [2P, 2]
        drawn.extend(draw[group_of[draw[:, 0]] != group_of[draw[:, 1]]].tolist())
    return [(index[i], index[j]) for i, j in drawn[:max_pairs]]


def duplicate_rate(outputs: Sequence[Sequence[str]]) -> tuple[float, str, int]:
    """Fraction of outputs whose normalized text is also an output of another input.

    Returns (rate, the most widespread duplicated text, how many inputs produce it).

    >>> duplicate_rate([["Big news", "cats"], ["big news!"], ["dogs"]])
    (0.5, 'big news', 2)
    """
    keys = [[normalize(o) for o in group] for group in outputs]
    inputs_per_key: Counter[str] = Counter()
    for group in keys:
        inputs_per_key.update(set(group))
    total = sum(len(group) for group in keys)
    if total == 0:
        return 0.0, "", 0
    shared = sum(1 for group in keys for k in group if inputs_per_key[k] > 1)
    top, count = inputs_per_key.most_common(1)[0]
    if count < 2:
        return shared / total, "", 1
    return shared / total, top, count


def mean_ngram_jaccard(outputs: Sequence[Sequence[str]], n: int, pairs: Sequence[Pair]) -> float:
    """Mean word n-gram Jaccard similarity over the given cross-input pairs."""
    grams = [[ngrams(words(o), n) for o in group] for group in outputs]
    if not pairs:
        return 0.0
    return float(np.mean([jaccard(grams[a][i], grams[b][j]) for (a, i), (b, j) in pairs]))


def mean_cosine(vectors: Sequence[np.ndarray], pairs: Sequence[Pair]) -> float:
    """Mean cosine similarity over the given pairs; `vectors[g]` is group g's [n_g, d] embeddings."""
    if not pairs:
        return 0.0
    unit = []
    for v in vectors:
        v = np.asarray(v, dtype=float)  # [n_g, d]
        norms = np.linalg.norm(v, axis=1, keepdims=True)
        unit.append(v / np.where(norms == 0, 1.0, norms))
    return float(np.mean([unit[a][i] @ unit[b][j] for (a, i), (b, j) in pairs]))


def overlap(output_words: set[str], input_words: set[str]) -> float:
    """Share of an output's distinct words that occur in an input: |o & x| / |o| (0 for empty o)."""
    return len(output_words & input_words) / len(output_words) if output_words else 0.0


def grounding(outputs: Sequence[Sequence[str]], inputs: Sequence[str]) -> dict[str, float]:
    """How much outputs are about their own input rather than any input.

    For output o of input g: own = overlap(o, x_g); shuffled = mean over h != g of overlap(o, x_h)
    (the expected score against a random other input); o is *retrieved* when its own input beats
    every other one strictly. Returns own and shuffled means, the retrieval accuracy and its chance
    level 1/G. Words shared by every input shift all scores alike and cannot make a match.

    >>> g = grounding([["red fox"], ["blue whale"]], ["the red fox runs", "a blue whale swims"])
    >>> g["accuracy"], g["own"], g["shuffled"]
    (1.0, 1.0, 0.0)
    """
    bags = [set(words(x)) for x in inputs]
    own: list[float] = []
    shuffled: list[float] = []
    hits = 0
    for g, group in enumerate(outputs):
        for text in group:
            o = set(words(text))
            scores = [overlap(o, bag) for bag in bags]
            others = scores[:g] + scores[g + 1 :]
            own.append(scores[g])
            shuffled.append(float(np.mean(others)) if others else 0.0)
            hits += bool(others) and scores[g] > max(others)
    n = len(own)
    return {
        "own": float(np.mean(own)) if n else 0.0,
        "shuffled": float(np.mean(shuffled)) if n else 0.0,
        "accuracy": hits / n if n else 0.0,
        "chance": 1.0 / len(inputs) if inputs else 0.0,
    }
