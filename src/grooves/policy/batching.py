"""Dynamic batching: requests that arrive together are sampled together.

An agent rollout makes one request per turn, and a GRPO step runs many rollouts at once, so the
server sees many small concurrent requests. Sampling them one by one leaves most of each matmul
idle; this scheduler lets requests queue for a few milliseconds, then samples all queued prompts
as one batch on a worker thread (the event loop stays free for HTTP while torch computes).

The wait is a quiet window, not a fixed one: it ends when no request has arrived for `window_s`
(or after `max_wait_s` in all). The rollouts of one GRPO group reach the scheduler a few
milliseconds apart (each renders its chat template first, more slowly on a busy machine), and a
window of fixed length can close in the middle of a group: its second part would then wait for
the whole decode of the first. Decoding is memory-bound on CPU, so a larger batch costs little
more than a small one and waiting a few milliseconds more is cheap (CHANGELOG.md, change 1).

With several LoRA adapters served on one base, a batch is split by adapter and each part is
sampled with its adapter active, one part after the other. (peft can mix adapters within one
forward via `adapter_names`, but the sampler drops finished rows from its KV cache as it decodes,
so that per-row list would have to follow every drop; per-adapter parts are exact and simple.)

One request never fails another. If a batch raises, each of its requests is sampled again on its
own, so the error reaches only the request that causes it. A request whose caller stops waiting
(its task is cancelled: the HTTP client went away) is marked, and the sampler drops its rows at
the next decode step, or skips it if it is still queued. Otherwise a long request whose client
had left would keep the sampler busy to its last token while other requests waited behind it.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass

from grooves.policy.sampling import Completion, SamplingParams


@dataclass
class _Job:
    prompt: list[int]
    params: SamplingParams
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    adapter: str | None = None
    """Extra adapter to sample with (`policy.adapters.load`); None: the policy's own weights."""
    cancelled: bool = False
    """Set from the event loop when the caller stopped waiting; read by the sampler thread."""

    def is_cancelled(self) -> bool:
        return self.cancelled


@dataclass
class SchedulerCounters:
    """What the sampler thread has done, for tests and metrics."""

    batches: int = 0
    """`policy.generate` calls started (a failed batch's per-request retries count too)."""
    failed_requests: int = 0
    """Requests answered with an exception."""
    cancelled_requests: int = 0
    """Requests dropped because their caller stopped waiting (before or during sampling)."""
    cancelled_tokens: int = 0
    """Tokens sampled for cancelled requests before their rows left the batch."""


class BatchScheduler:
    """Collects `submit` calls until none arrives for `window_s` (at most `max_wait_s`), then samples them in one `policy.generate`."""

    def __init__(self, policy, *, max_batch_rows: int = 64, window_s: float = 0.015, max_wait_s: float = 0.1):
        self.policy = policy
        self.max_batch_rows = max_batch_rows
        self.window_s = window_s
        self.max_wait_s = max_wait_s
        self.counters = SchedulerCounters()
        self._queue: queue.Queue = queue.Queue()  # _Job, or _STOP
        self._thread = threading.Thread(target=self._run, name="grooves-sampler", daemon=True)
        self._thread.start()

    async def submit(
        self, prompt: list[int], params: SamplingParams, adapter: str | None = None
    ) -> list[Completion]:
        """The request's completions; cancelling the awaiting task withdraws the request from the sampler."""
        if not self._thread.is_alive():
            raise RuntimeError("the sampler was closed")
        loop = asyncio.get_running_loop()
        job = _Job(prompt, params, loop.create_future(), loop, adapter)
        self._queue.put(job)
        try:
            return await job.future
        except asyncio.CancelledError:
            job.cancelled = True
            raise

    def close(self) -> None:
        """Stop the worker thread once the batch it is sampling is done; requests still queued fail.

        The thread is a daemon, but a process that exits while it is inside torch can abort
        ("terminate called without an active exception"), so an owner that ends (the trainer on
        Ctrl-C, a server shutting down) closes the scheduler first."""
        self._fail_queued()
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self._fail_queued()  # anything submitted meanwhile

    def _fail_queued(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not _STOP:
                _deliver(job, RuntimeError("the sampler was closed"))

    def _take_batch(self) -> list[_Job] | None:
        first = self._queue.get()
        if first is _STOP:
            return None
        jobs = [first]
        rows = jobs[0].params.n
        deadline = time.monotonic() + self.max_wait_s
        while rows < self.max_batch_rows:
            timeout = min(
                self.window_s, deadline - time.monotonic()
            )  # quiet for window_s: the batch is complete
            try:
                job = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                self._queue.put(_STOP)  # sample what came before it, then stop
                break
            jobs.append(job)
            rows += job.params.n
        return jobs

    def _run(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            try:
                waiting = [j for j in batch if not j.cancelled]
                self.counters.cancelled_requests += len(batch) - len(waiting)
                by_adapter: dict[str | None, list[_Job]] = {}
                for job in waiting:
                    by_adapter.setdefault(job.adapter, []).append(job)
                for adapter, jobs in by_adapter.items():
                    self._generate(adapter, jobs)
            except Exception as exc:  # the thread must outlive any error, or every later request would hang
                for job in batch:
                    _deliver(job, exc)

    def _generate(self, adapter: str | None, jobs: list[_Job]) -> None:
        try:
            results = self._sample(adapter, jobs)
        except Exception as exc:
            if len(jobs) == 1:
                self.counters.failed_requests += 1
                _deliver(jobs[0], exc)
                return
            for job in jobs:  # sampled alone, a bad request fails by itself and the others go through
                if not job.cancelled:
                    self._generate(adapter, [job])
            return
        for job, completions in zip(jobs, results, strict=True):
            if job.cancelled:
                self.counters.cancelled_requests += 1
                self.counters.cancelled_tokens += sum(len(c.token_ids) for c in completions)
            else:
                _deliver(job, completions)

    def _sample(self, adapter: str | None, jobs: list[_Job]) -> list[list[Completion]]:
        self.counters.batches += 1
        prompts, params = [j.prompt for j in jobs], [j.params for j in jobs]
        cancelled = [j.is_cancelled for j in jobs]
        if adapter is None:
            return self.policy.generate(prompts, params, cancelled=cancelled)
        return self.policy.generate(prompts, params, adapter=adapter, cancelled=cancelled)


_STOP = object()
"""Queued by `close`: the worker thread ends when it takes it."""


def _deliver(job: _Job, outcome) -> None:
    """Hand a result (or an exception) to the waiting request on its event loop."""
    try:
        job.loop.call_soon_threadsafe(_settle, job.future, outcome)
    except RuntimeError:  # that loop has closed: nobody is waiting any more
        pass


def _settle(future: asyncio.Future, outcome) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
