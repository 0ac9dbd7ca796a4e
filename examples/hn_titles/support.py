"""Is every claim of a title supported by its story? A strict, explainable code check.

A title's *claims* are its content words: every word that is not a function word, which covers
numbers ("40"), names ("Quill", "MIT") and assertions ("shocking", "finally", "believe"). A claim
is supported when the same word, after light normalization (lower case, a possessive and a
plural or -ing/-ed ending dropped), occurs in the story. The check is extractive on purpose: it cannot be argued with,
costs microseconds, and is exactly what a sensational title fails, because "You won't believe
this shocking 10x trick" asserts things no story says. Its price is that an honest paraphrase
("speeds up" for "cuts ... time") counts as unsupported; an LLM judge (see `task.py`, gate
"judge") accepts paraphrases, but the embedded 135M model cannot judge, so the demonstration
gates with this check.

    supported_fraction(title, body) = |claims(title) found in body| / |claims(title)|   (0 if none)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WORD = re.compile(r"\d+(?:[.,]\d+)*[a-z]*|[a-z]+(?:'[a-z]+)?")

FUNCTION_WORDS = frozenset(
    """a an the and or but nor of to in on at by for from with without into onto over under about
    as than then so if it its it's this that these those there here is are was were be been being
    am do does did has have had will would can could should may might must shall won't don't
    doesn't didn't can't isn't aren't wasn't weren't i me my we us our you your he him his she her
    they them their who whom whose which what when where why how all any some each every no not
    just now up out off new via vs let's i'm you're you'll you've we're we'll they're he's she's
    that's here's there's what's who's""".split()
)
"""Words that assert nothing on their own. "new" is here because every story is news."""


def normalize(word: str) -> str:
    """A light suffix stripper applied to story and title alike, so word forms meet.

    Lower case; drop a possessive `'s`, then one of the endings -ies (-> y), -s, -ing, -ed, then
    a final -e. It is not linguistics, only consistent: "release", "releases" and "released"
    all become "releas", "build" and "building" both "build".

    >>> [normalize(w) for w in ["Quill's", "Bees", "released", "release", "building", "studies", "class", "40"]]
    ['quill', 'bee', 'releas', 'releas', 'build', 'study', 'class', '40']
    """
    w = word.lower().replace("\u2019", "'")
    if w.endswith("'s"):
        w = w[:-2]
    w = w.rstrip("'")
    if w in FUNCTION_WORDS or not w.isalpha() or len(w) <= 3:
        return w
    if w.endswith("ies") and len(w) > 4:
        return w[:-3] + "y"
    if w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    elif w.endswith("ing") and len(w) > 5:
        w = w[:-3]
    elif w.endswith("ed") and len(w) > 4:
        w = w[:-2]
    return w[:-1] if w.endswith("e") and len(w) > 3 else w


def words(text: str) -> list[str]:
    """Normalized word and number tokens of `text` ("10x" and "12m" stay one token); lone letters go."""
    raw = _WORD.findall(text.lower().replace("\u2019", "'"))
    return [normalize(w) for w in raw if len(w) > 1 or w.isdigit()]


def claims(title: str) -> list[str]:
    """The title's content words, in order, without repeats.

    >>> claims("Show HN: Quill, a tiny database written in Rust")
    ['show', 'hn', 'quill', 'tiny', 'databas', 'written', 'rust']
    """
    out: list[str] = []
    for w in words(title):
        if w not in FUNCTION_WORDS and w not in out:
            out.append(w)
    return out


@dataclass(frozen=True)
class Support:
    """Which claims of a title its story supports."""

    supported: tuple[str, ...]
    unsupported: tuple[str, ...]

    @property
    def fraction(self) -> float:
        n = len(self.supported) + len(self.unsupported)
        return len(self.supported) / n if n else 0.0


def check_support(title: str, body: str) -> Support:
    """Split the claims of `title` into those found in `body` and the rest."""
    vocabulary = set(words(body))
    found = [c for c in claims(title) if c in vocabulary]
    missing = [c for c in claims(title) if c not in vocabulary]
    return Support(tuple(found), tuple(missing))


def supported_fraction(title: str, body: str) -> float:
    """Share of the title's claims found in the story; a title with no claims scores 0.

    >>> body = "Two students released Quill, a tiny database written in Rust."
    >>> supported_fraction("Quill: a tiny database in Rust", body)
    1.0
    >>> supported_fraction("Shocking: Quill is 10x faster", body)
    0.25
    """
    return check_support(title, body).fraction
