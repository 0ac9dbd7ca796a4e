"""One judgment request: cache lookup, the call, validation, one repair, then a final verdict.

Shared by group and absolute judging so both follow the same contract: a reply that breaks the
format is sent back once with the exact error ("expected exactly 4 scores ... got 5"); if the
repaired reply is still invalid the judgment fails with `JudgeError`.

Each request gets a fresh nonce (`prompt.with_nonce`) that the verdict must repeat, and the
reply is checked against the texts being judged (`verdict.read_verdict`), so a verdict cannot be
copied out of a judged output or out of a judge's echo of the request. Only validated replies are
cached, with the nonce they were checked against; the cache key is taken over the request with
the nonce slot, so identical requests share it. Failures are never cached: re-asking pays again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

from grooves.judge.endpoint import JudgeClient
from grooves.judge.errors import InvalidJudgment, JudgeError
from grooves.judge.prompt import new_nonce, repair_messages, with_nonce
from grooves.judge.verdict import Seal

T = TypeVar("T")

Parse = Callable[[str, Seal], T]
"""`parse(reply, seal)`: the validated verdict, or InvalidJudgment."""


def _from_cache(client: JudgeClient, key: str, judged: tuple[str, ...], parse: Parse[T]) -> T | None:
    stored = client.cache_get(key)
    if stored is None:
        return None
    try:
        entry = json.loads(stored)
        return parse(str(entry["reply"]), Seal(str(entry["nonce"]), judged))
    except (ValueError, TypeError, KeyError):  # stored by an older or laxer version: judge again
        return None


async def ask(
    client: JudgeClient, messages: list[dict[str, str]], judged: tuple[str, ...], parse: Parse[T], key: str
) -> T:
    """Return `parse(reply, seal)` for the judge's reply to `messages`, from the cache when `key` is there.

    `messages` carry `prompt.NONCE_SLOT`; `judged` are the texts shown to the judge for scoring.
    """
    cached = _from_cache(client, key, judged, parse)
    if cached is not None:
        return cached
    seal = Seal(new_nonce(), judged)
    request = with_nonce(messages, seal.nonce)
    first = await client.complete(request)
    try:
        result, text = parse(first.text, seal), first.text
    except InvalidJudgment as error:
        second = await client.complete(repair_messages(request, first.text, str(error)))
        try:
            result, text = parse(second.text, seal), second.text
        except InvalidJudgment as again:
            first_error = "" if str(again) == str(error) else f" (first: {error})"
            raise JudgeError(
                f"judge reply invalid, and still invalid after one repair: {again}{first_error}"
            ) from again
    client.cache_put(key, json.dumps({"nonce": seal.nonce, "reply": text}))
    return result
