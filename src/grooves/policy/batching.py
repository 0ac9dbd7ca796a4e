"""Dynamic batching: requests that arrive together are sampled together.

An agent rollout makes one request per turn, and a GRPO step runs many rollouts at once, so the
server sees many small concurrent requests. Sampling them one by one leaves most of each matmul
idle; this scheduler lets requests queue for a few milliseconds, then samples all queued prompts
as one batch on a worker thread (the event loop stays free for HTTP while torch computes).
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


class BatchScheduler:
    """Collects `submit` calls for up to `window_s`, then samples them in one `policy.generate`."""

    def __init__(self, policy, *, max_batch_rows: int = 64, window_s: float = 0.004):
        self.policy = policy
        self.max_batch_rows = max_batch_rows
        self.window_s = window_s
        self._queue: queue.Queue[_Job] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="grooves-sampler", daemon=True)
        self._thread.start()

    async def submit(self, prompt: list[int], params: SamplingParams) -> list[Completion]:
        loop = asyncio.get_running_loop()
        job = _Job(prompt, params, loop.create_future(), loop)
        self._queue.put(job)
        return await job.future

    def _take_batch(self) -> list[_Job]:
        jobs = [self._queue.get()]
        rows = jobs[0].params.n
        deadline = time.monotonic() + self.window_s
        while rows < self.max_batch_rows:
            timeout = deadline - time.monotonic()
            try:
                job = self._queue.get(timeout=max(timeout, 0)) if timeout > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            jobs.append(job)
            rows += job.params.n
        return jobs

    def _run(self) -> None:
        while True:
            jobs = self._take_batch()
            try:
                results = self.policy.generate([j.prompt for j in jobs], [j.params for j in jobs])
            except Exception as exc:  # delivered to the waiting request, which turns it into an HTTP error
                for j in jobs:
                    j.loop.call_soon_threadsafe(_set_exception, j.future, exc)
                continue
            for j, res in zip(jobs, results, strict=True):
                j.loop.call_soon_threadsafe(_set_result, j.future, res)


def _set_result(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
