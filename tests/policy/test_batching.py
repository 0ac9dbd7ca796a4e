"""The sampler's batching thread: `close` finishes the batch in flight, fails the rest, and ends the thread."""

from __future__ import annotations

import asyncio
import threading

import pytest

from grooves.policy.batching import BatchScheduler
from grooves.policy.sampling import SamplingParams
from grooves.policy.transformers import TransformersPolicy


def test_close_finishes_the_batch_in_flight_fails_the_queued_ones_and_ends_the_thread(tiny_model_dir):
    policy = TransformersPolicy(str(tiny_model_dir))
    scheduler = BatchScheduler(policy, window_s=0.001, max_wait_s=0.001)
    prompt = policy.prompts.render([{"role": "user", "content": "hello"}], None)
    params = SamplingParams(max_tokens=3, temperature=0)

    async def go():
        with policy.lock:  # the sampler blocks inside generate() until this is released
            first = asyncio.ensure_future(scheduler.submit(prompt, params))
            while not scheduler._queue.empty():  # the sampler took it...
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # ...and its batch window is over: it waits for the lock in generate()
            queued = asyncio.ensure_future(scheduler.submit(prompt, params))
            await asyncio.sleep(0.05)
            closer = threading.Thread(target=scheduler.close)
            closer.start()
            await asyncio.sleep(0.2)
            assert closer.is_alive()  # close() waits for the batch in flight
        while closer.is_alive():
            await asyncio.sleep(0.01)
        assert len((await first)[0].token_ids) == 3
        with pytest.raises(RuntimeError, match="the sampler was closed"):
            await queued
        with pytest.raises(RuntimeError, match="the sampler was closed"):
            await scheduler.submit(prompt, params)

    asyncio.run(go())
    assert not scheduler._thread.is_alive()
    scheduler.close()  # a second close does nothing
