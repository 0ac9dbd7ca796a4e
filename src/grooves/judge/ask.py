"""One judgment request: cache lookup, the call, validation, one repair, then a final verdict.

Shared by group and absolute judging so both follow the same contract: a reply that breaks the
format is sent back once with the exact error ("expected exactly 4 scores ... got 5"); if the
repaired reply is still invalid the judgment fails with `JudgeError`. Only validated replies are
cached, so a cache hit never needs checking twice and a glitch is not replayed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from grooves.judge.client import JudgeClient
from grooves.judge.errors import InvalidJudgment, JudgeError
from grooves.judge.prompt import repair_messages

T = TypeVar("T")


async def ask(client: JudgeClient, messages: list[dict[str, str]], parse: Callable[[str], T], key: str) -> T:
    """Return `parse(reply)` for the judge's reply to `messages`, from the cache when `key` is there."""
    cached = client.cache_get(key)
    if cached is not None:
        try:
            return parse(cached)
        except InvalidJudgment:
            pass  # stored by an older, laxer parser: judge again
    first = await client.complete(messages)
    try:
        result = parse(first.text)
    except InvalidJudgment as error:
        second = await client.complete(repair_messages(messages, first.text, str(error)))
        try:
            result = parse(second.text)
        except InvalidJudgment as again:
            raise JudgeError(f"judge reply invalid, and still invalid after one repair: {again} (first: {error})") from again
        client.cache_put(key, second.text)
        return result
    client.cache_put(key, first.text)
    return result
