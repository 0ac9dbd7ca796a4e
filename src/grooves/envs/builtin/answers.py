"""Checks on a final answer's text, shared by the graders: mentions, amounts, numbers.

Graders look for specific facts (an order id, an amount, a year), matched on word boundaries and
case-insensitively, and refuse hedges: an answer that lists several candidate values for one
question is not credited for containing the right one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_INT = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?![\w,]*\d)|(?<![\w.,])\d+(?![\w.,]*\d)")


def mentions(answer: str, phrase: str) -> bool:
    """True if `phrase` occurs in `answer` as whole words, ignoring case.

    >>> mentions("Refunded order O1042.", "o1042"), mentions("O10420", "O1042")
    (True, False)
    """
    if not phrase:
        return False
    return re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", answer, flags=re.IGNORECASE) is not None


def mentions_any(answer: str, phrases: Iterable[str]) -> bool:
    return any(mentions(answer, p) for p in phrases)


def money(cents: int) -> str:
    """Cents as dollars with a thousands separator.

    >>> money(123456)
    '$1,234.56'
    """
    return f"${cents // 100:,}.{cents % 100:02d}"


def mentions_money(answer: str, cents: int) -> bool:
    """The amount written as $1,234.56, 1234.56 or 1,234.56 (cents always shown).

    >>> mentions_money("We refunded $1,234.56.", 123456), mentions_money("1234.5", 123450)
    (True, False)
    """
    plain = f"{cents // 100}.{cents % 100:02d}"
    grouped = money(cents)[1:]
    return any(re.search(rf"(?<![\d.,]){re.escape(form)}(?![\d])", answer) for form in (plain, grouped))


def integers(text: str) -> set[int]:
    """Standalone integers in `text` (digits inside ids such as O1042 or decimals don't count).

    >>> sorted(integers("In 1,723 and 1811; order O1042 costs 3.50"))
    [1723, 1811]
    """
    return {int(m.group(0).replace(",", "")) for m in _INT.finditer(text)}


def states_number(answer: str, expected: int, max_distinct: int = 2) -> bool:
    """`expected` appears, and the answer does not hedge across many numbers.

    >>> states_number("We have 7 in stock.", 7), states_number("Maybe 3, 5, 7 or 9.", 7)
    (True, False)
    """
    found = integers(answer)
    return expected in found and len(found) <= max_distinct
