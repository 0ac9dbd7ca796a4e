"""Tinker's futures: a request answers at once with a request id; the work runs behind it.

Every Tinker call that does work (`forward_backward`, `optim_step`, `asample`, saving and loading
weights, `create_model`) answers `{"request_id"}` at once, and the SDK then polls
`/api/v1/retrieve_future` until the result is there. `Futures` holds that state per request:
running (a poll waits up to `wait` seconds for it, then answers `try_again`, which the SDK polls
again), done (the result: a JSON object, or protobuf bytes for the message types the SDK reads as
protobuf) or failed (`{"error", "category"}`: "user" for a request that cannot run, "server" for
a fault here; the SDK raises `RequestFailedError` with the message). A result stays retrievable
for a while after it is first read, so a poll whose answer was lost gets it again.

A training model's requests run in the order of their `seq_id` (`SeqOrder`): the SDK numbers each
training client's requests 1, 2, 3, ... and may send the chunks of one `forward_backward` at once,
later ones first, so a request waits until every lower id has run. A request takes its id as soon
as its model and id are read, before the rest of it is checked: the SDK counts a refused request's
id as used and numbers the next one after it, so a refusal fails its future at its turn, and the
turn passes (an id left unused would hold every later request of the client for ever). An id
already used is refused when it arrives, before anything runs, unless it is the same request sent
again (the SDK resends a request whose answer it did not get): that one gets the first one's
request id back.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

Result = dict[str, Any] | bytes


class RequestFailed(Exception):
    """A request that ran and failed; `category` is "user" (its input) or "server"."""

    def __init__(self, message: str, category: str = "user"):
        super().__init__(message)
        self.category = category


@dataclass
class _Entry:
    tenant: str
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: Result | None = None
    read_at: float | None = None


class Futures:
    """Request id -> its state, per tenant (another tenant's id does not exist for a caller)."""

    def __init__(self, *, keep: int = 4096, wait: float = 20.0, keep_read_seconds: float = 300.0):
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._tasks: set[asyncio.Task] = set()
        self.keep, self.wait, self.keep_read_seconds = keep, wait, keep_read_seconds

    def submit(self, tenant: str, work: Callable[[], Awaitable[Result]]) -> str:
        """Start `work` as a task of its own; returns the request id its result is polled by."""
        request_id = uuid.uuid4().hex
        entry = self._entries[request_id] = _Entry(tenant)
        task = asyncio.ensure_future(self._run(entry, work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._forget()
        return request_id

    async def _run(self, entry: _Entry, work: Callable[[], Awaitable[Result]]) -> None:
        try:
            entry.result = await work()
        except RequestFailed as exc:
            entry.result = {"error": str(exc), "category": exc.category}
        except Exception as exc:  # a fault here: the caller is told, the service keeps serving
            entry.result = {"error": f"{type(exc).__name__}: {exc}", "category": "server"}
        finally:
            entry.done.set()

    async def retrieve(self, tenant: str, request_id: str) -> Result | None:
        """The result of `request_id`, waiting up to `wait` s; None: still running (try again).
        Raises KeyError for an id this tenant does not have."""
        entry = self._entries.get(request_id)
        if entry is None or entry.tenant != tenant:
            raise KeyError(request_id)
        if not entry.done.is_set():
            try:
                await asyncio.wait_for(asyncio.shield(entry.done.wait()), self.wait)
            except TimeoutError:
                return None
        if entry.read_at is None:
            entry.read_at = time.monotonic()
        return entry.result

    def _forget(self) -> None:
        """Drop results read long ago, then the oldest finished ones past `keep`."""
        now = time.monotonic()
        for request_id, entry in list(self._entries.items()):
            if entry.read_at is not None and now - entry.read_at > self.keep_read_seconds:
                del self._entries[request_id]
        finished = [k for k, e in self._entries.items() if e.done.is_set()]
        for request_id in finished[: max(0, len(self._entries) - self.keep)]:
            del self._entries[request_id]


class SeqOrder:
    """Runs one model's requests in `seq_id` order: `run(seq_id, work)` waits for every lower id."""

    MAX_AHEAD = 4096
    """How far past the next id a request may arrive (the SDK keeps a few in flight)."""

    KEEP = 1024
    """How many of the latest requests' (digest, request id) are kept to answer a resent request."""

    def __init__(self, first: int = 1):
        self.next = first
        self._claimed: set[int] = set()
        self._turn = asyncio.Condition()
        self._seen: OrderedDict[int, tuple[str, str]] = OrderedDict()

    def resent(self, seq_id: int, digest: str) -> str | None:
        """The request id of `seq_id` when the same request (`digest`) was already received: the SDK
        sends a request again when its answer was lost, and gets the same future back."""
        seen = self._seen.get(seq_id)
        return seen[1] if seen is not None and seen[0] == digest else None

    def remember(self, seq_id: int, digest: str, request_id: str) -> None:
        self._seen[seq_id] = (digest, request_id)
        while len(self._seen) > self.KEEP:
            self._seen.popitem(last=False)

    def claim(self, seq_id: int) -> None:
        """Reserve `seq_id` when its request arrives; a used, repeated or far-off id is a ValueError."""
        if seq_id < self.next or seq_id in self._claimed:
            raise ValueError(
                f"seq_id {seq_id} was already used by this model; its next request is seq_id {self._next_free()} "
                "(requests are numbered 1, 2, 3, ... per training client)"
            )
        if seq_id > self.next + self.MAX_AHEAD:
            raise ValueError(
                f"seq_id {seq_id} is more than {self.MAX_AHEAD} past this model's next request ({self.next})"
            )
        self._claimed.add(seq_id)

    def _next_free(self) -> int:
        n = self.next
        while n in self._claimed:
            n += 1
        return n

    async def run(self, seq_id: int, work: Callable[[], Awaitable[Result]]) -> Result:
        """`work` once every lower id has run (`seq_id` claimed first)."""
        async with self._turn:
            await self._turn.wait_for(lambda: self.next == seq_id)
        try:
            return await work()
        finally:
            async with self._turn:
                self._claimed.discard(seq_id)
                self.next = seq_id + 1
                self._turn.notify_all()
