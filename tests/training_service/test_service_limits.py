"""The training service's bounds on a step, through its own client and wire protocol: a step past a
limit is refused naming the setting, a step whose numbers cannot be recorded is never applied, an
applied step is always answered, and one tenant's damaged files do not stop the service."""

from __future__ import annotations

import asyncio
import json
import resource
import signal
import time

import pytest
import torch
from service_support import adapter, create, hosted, http, service, toy_config

from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup
from grooves.remote import ServiceError
from grooves.remote.wire import to_records
from grooves.serve.errors import APIError
from grooves.training_service.validate import StepLimits


def _groups(
    groups: int = 2, size: int = 4, *, prompt: int = 20, completion: int = 4, **traj
) -> list[TrajectoryGroup]:
    """`groups` groups of `size` one-turn trajectories sampled by version 0, rewards 0..size-1."""
    out = []
    for g in range(groups):
        trajectories = []
        for t in range(size):
            turn = SampledTurn(
                prompt_token_ids=[3 + (g * 7 + i) % 400 for i in range(prompt)],
                token_ids=[3 + (t * 5 + i) % 400 for i in range(completion)],
                logprobs=[-1.0] * completion,
                adapter_version=0,
            )
            trajectories.append(Trajectory(turns=[turn], reward=float(t), metrics={"success": t % 2}, **traj))
        out.append(TrajectoryGroup(trajectories=trajectories))
    return out


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


async def _refused(model, groups, status: int, param: str, *says: str) -> None:
    with pytest.raises(ServiceError) as refused:
        await model.train(groups)
    error = refused.value
    assert (error.status, error.param) == (status, param), error
    for text in says:
        assert text in error.message, error.message


# ---- item: a step's size -----------------------------------------------------------------------
def test_a_step_past_a_limit_of_the_service_is_refused_naming_the_setting(tiny_model_dir, tmp_path):
    """8 trajectories of 24 tokens against at most 7 trajectories, 150 tokens and 23 per sequence."""
    limits = StepLimits(max_step_tokens=150, max_step_trajectories=7, max_sequence_tokens=23)

    async def run():
        async with service(tmp_path / "svc", tiny_model_dir, limits=limits) as (app, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            start = adapter(hosted(app, "toy").policy)
            groups = _groups()
            await _refused(
                model,
                groups,
                413,
                "groups",
                "8 trajectories",
                "limit of 7 per step (--max-step-trajectories)",
            )
            groups[1].trajectories.pop()  # 7 trajectories of 24 tokens: 168
            await _refused(
                model, groups, 413, "groups", "hold 168 prompt and sampled token ids", "(--max-step-tokens)"
            )
            groups[1].trajectories.pop()  # 6 of 24: 144 tokens, each sequence one past the bound
            await _refused(
                model,
                groups,
                400,
                "groups[0].trajectories[0].turns[0].token_ids",
                "hold 24 tokens, more than this service's limit of 23 per sequence (--max-sequence-tokens)",
            )
            assert hosted(app, "toy").step == 0 and _equal(start, adapter(hosted(app, "toy").policy))
            fits = _groups(prompt=19)  # 23 tokens each
            del fits[1].trajectories[2:]
            assert (await model.train(fits)).step == 1
            await model.close()

    asyncio.run(run())


def test_a_sequence_longer_than_one_micro_batch_holds_is_refused(tiny_model_dir, tmp_path):
    """The tiny Llama's micro-batch of 65536 tokens holds a row of 6224 once attention's 16 bytes per
    pair of positions are counted (tests/training/test_memory.py): a turn of 6225 tokens, within the
    model's context (8192) and the service's default --max-sequence-tokens (8192), is refused."""

    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (app, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            assert hosted(app, "toy").config.optim.micro_batch_tokens == 65536
            groups = _groups()
            groups[1].trajectories[3].turns[0].prompt_token_ids = [5] * 6221  # + 4 sampled: 6225
            await _refused(
                model,
                groups,
                400,
                "groups[1].trajectories[3].turns[0].token_ids",
                "hold 6225 tokens, more than the 6224 tokens one micro-batch of this model holds in a row "
                "(optim.micro_batch_tokens = 65536",
            )
            assert hosted(app, "toy").step == 0
            await model.close()

    asyncio.run(run())


def test_a_micro_batch_past_the_services_memory_is_refused_at_creation(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (app, transport), http(transport) as client:
            config = toy_config(tiny_model_dir, optim={"micro_batch_tokens": 131072})
            resp = await client.post("/v1/trainable_models", json={"name": "toy", "config": config})
            error = resp.json()["error"]
            assert resp.status_code == 400 and error["param"] == "config.optim.micro_batch_tokens", error
            assert (
                "131072 is more than this service's free memory holds in one micro-batch (65536"
                in error["message"]
            )
            assert len(app.state.service.models) == 0

    asyncio.run(run())


# ---- a step is applied only when it can be recorded, and is always answered ----------------------
def test_a_step_whose_statistics_overflow_is_refused_and_never_applied(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (app, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            start = adapter(hosted(app, "toy").policy)
            for field, change in [
                ("metrics.success", lambda t: t.metrics.update(success=1e308)),
                ("reward", lambda t: setattr(t, "reward", 1e308)),
            ]:
                groups = _groups()
                change(groups[0].trajectories[1])
                await _refused(
                    model,
                    groups,
                    400,
                    f"groups.0.trajectories.1.{field}",
                    "less than or equal to 1000000000000000",
                )
            assert hosted(app, "toy").step == 0 and _equal(start, adapter(hosted(app, "toy").policy))
            # the model's own step: statistics first, so a step they fail on leaves the weights alone
            overflowing = _groups()
            for t in overflowing[0].trajectories:
                t.metrics["success"] = 1e308
            with pytest.raises(OverflowError):
                await asyncio.to_thread(hosted(app, "toy").train, overflowing, "digest")
            assert hosted(app, "toy").step == 0 and _equal(start, adapter(hosted(app, "toy").policy))
            result = await model.train(_groups())  # step 1, as if nothing had been sent
            assert (result.step, result.replayed) == (1, False)
            assert result.metrics["success_rate"] == 0.5
            await model.close()

    asyncio.run(run())


def test_an_applied_step_with_non_finite_metrics_is_answered_with_null(tiny_model_dir, tmp_path):
    """Sampling logprobs of -1e308 (-inf in float32) make the loss non-finite: the update is skipped
    (`optim.on_nonfinite = "skip"`), the step is applied, and its answer, and every retry's, says so
    with null where metrics.jsonl has null."""

    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (app, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            groups = _groups()
            groups[0].trajectories[0].turns[0].logprobs = [-1e308] * 4
            result = await model.train(groups)
            assert (result.step, model.step, hosted(app, "toy").step) == (1, 1, 1)
            assert result.metrics["nonfinite_skipped"] == 1.0 and result.metrics["loss"] is None
            logged = json.loads((tmp_path / "svc" / "default" / "toy" / "metrics.jsonl").read_text())
            assert logged == result.metrics
            again = await model.train(groups, step=1)
            assert again.replayed and again.metrics == result.metrics
            await model.close()

    asyncio.run(run())


def test_a_step_with_nothing_to_train_or_a_temperature_below_the_floor_is_refused(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (app, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            failed = [
                TrajectoryGroup(trajectories=[Trajectory(error="TimeoutError: judge did not answer")] * 4)
                for _ in range(2)
            ]
            await _refused(model, failed, 400, "groups", "no group has two trajectories that did not fail")
            lonely = _groups()  # one rollout of each group did not fail
            for g in lonely:
                for t in g.trajectories[1:]:
                    t.error = "ConnectionError: environment down"
            await _refused(model, lonely, 400, "groups", "nothing to train")
            cold = _groups()
            cold[1].trajectories[2].turns[0].temperature = 1e-300
            await _refused(
                model,
                cold,
                400,
                "groups.1.trajectories.2.turns.0.temperature",
                "1e-300 is below 1e-05, the smallest temperature besides 0 (greedy)",
            )
            assert hosted(app, "toy").step == 0
            greedy = _groups()
            greedy[0].trajectories[0].turns[0].temperature = 0.0
            assert (await model.train(greedy)).step == 1
            await model.close()

    asyncio.run(run())


# ---- the wire's types --------------------------------------------------------------------------
def test_wire_numbers_are_json_numbers_and_keys_are_text(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (app, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            good = json.dumps({"step": 1, "groups": to_records(_groups())})
            cases = [
                ('"reward": 1.0', '"reward": "1"', "groups.0.trajectories.1.reward", "valid number"),
                ('"reward": 2.0', '"reward": true', "groups.0.trajectories.2.reward", "valid number"),
                (
                    '"logprobs": [-1.0',
                    '"logprobs": ["-1"',
                    "groups.0.trajectories.0.turns.0.logprobs.0",
                    "valid number",
                ),
                (
                    '"temperature": 1.0',
                    '"temperature": false',
                    "groups.0.trajectories.0.turns.0.temperature",
                    "valid number",
                ),
                (
                    '"rewards": {}',
                    '"rewards": {"\\ud800": 1.0}',
                    None,
                    "not valid JSON (unexpected end of hex escape",
                ),
                (
                    '"metrics": {',
                    '"metrics": {"\\udc00x": 1.0, ',
                    None,
                    "not valid JSON (lone leading surrogate",
                ),
            ]
            async with http(transport) as client:
                for old, new, param, says in cases:
                    body = good.replace(old, new, 1)
                    assert body != good, old
                    resp = await client.post(
                        "/v1/trainable_models/toy/steps",
                        content=body.encode(),
                        headers={"Content-Type": "application/json"},
                    )
                    error = resp.json()["error"]
                    assert resp.status_code == 400 and error["param"] == param and says in error["message"], (
                        error
                    )
                assert hosted(app, "toy").step == 0
                resp = await client.post(
                    "/v1/trainable_models/toy/steps",
                    content=good,
                    headers={"Content-Type": "application/json"},
                )
                assert resp.status_code == 200 and resp.json()["step"] == 1
            await model.close()

    asyncio.run(run())


def test_a_large_step_is_read_off_the_event_loop(tiny_model_dir, tmp_path):
    """While a 5 MiB step is parsed and checked, `/v1/models` goes on answering."""
    groups = _groups(110, 8, prompt=300, completion=200)
    for g in groups:
        for t in g.trajectories:
            t.turns[0].logprobs = [-(i + 1) / 7 for i in range(200)]
    groups[-1].trajectories[-1].turns[0].adapter_version = 1  # refused once every group was checked
    body = json.dumps({"step": 1, "groups": to_records(groups)}).encode()
    assert len(body) > 5 * 2**20
    limits = StepLimits(max_step_tokens=10**6)

    async def run():
        async with service(tmp_path / "svc", tiny_model_dir, limits=limits) as (_, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            async with http(transport) as client:

                async def step() -> float:
                    t0 = time.perf_counter()
                    resp = await client.post(
                        "/v1/trainable_models/toy/steps",
                        content=body,
                        headers={"Content-Type": "application/json"},
                    )
                    assert resp.status_code == 400 and "newer than the model's live adapter" in resp.text
                    return time.perf_counter() - t0

                async def models() -> list[float]:
                    """The time between answers of `/v1/models`, asked every 10 ms, until the step ends."""
                    gaps, last = [], time.perf_counter()
                    while not stepping.done():
                        assert (await client.get("/v1/models")).status_code == 200
                        await asyncio.sleep(0.01)
                        gaps.append(time.perf_counter() - last)
                        last = time.perf_counter()
                    return gaps

                stepping = asyncio.ensure_future(step())
                gaps, took = await models(), await stepping
            # read on the event loop, the step held it throughout: no answer until the step's
            # (measured: 2, the first spanning the step); read on a worker thread, 8 to 13 (the raw JSON parse still holds
            # Python's lock for a part of the step's 0.35-0.75 s)
            assert len(gaps) >= 4, (took, gaps)
            await model.close()

    asyncio.run(run())


# ---- the folder --------------------------------------------------------------------------------
def _promoted(root) -> dict:
    return json.loads((root / "default" / "promotions.json").read_text())


def test_a_damaged_promotion_does_not_stop_the_service(tiny_model_dir, tmp_path, capfd):
    root = tmp_path / "svc"

    async def first():
        async with service(root, tiny_model_dir) as (_, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            await model.train(_groups())
            await model.promote(0, "toy-start")
            await model.promote(1, "toy-live")
            await model.close()

    async def names() -> list[str]:
        async with service(root, tiny_model_dir) as (app, transport), http(transport) as client:
            assert hosted(app, "toy").step == 1  # the model itself came back
            return [m["id"] for m in (await client.get("/v1/models")).json()["data"]]

    asyncio.run(first())
    assert set(_promoted(root)) == {"toy-start", "toy-live"}
    assert {"toy-start", "toy-live"} <= set(asyncio.run(names()))
    for file in (root / "default" / "toy" / "promoted" / "step_000000").iterdir():
        file.unlink()  # the promoted adapter of toy-start is gone
    (root / "default" / "toy" / "promoted" / "step_000000").rmdir()
    served = asyncio.run(names())
    assert "toy-live" in served and "toy-start" not in served
    err = capfd.readouterr().err
    assert err.count("not served again") == 1 and "promotions.json: 'toy-start' not served again:" in err
    (root / "default" / "promotions.json").write_text("")  # as a write cut short left it
    served = asyncio.run(names())
    assert "toy-live" not in served and "toy" in served
    err = capfd.readouterr().err
    assert "promotions.json: promotions not read: JSONDecodeError" in err


def test_promotions_are_written_whole_or_not_at_all(tiny_model_dir, tmp_path):
    """A full disk (here: a file size limit) while promotions.json is written leaves the file as it was."""
    root = tmp_path / "svc"

    async def run():
        async with service(root, tiny_model_dir) as (app, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            await model.promote(0, "toy-start")
            before = (root / "default" / "promotions.json").read_bytes()
            soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 16, hard))
            try:
                with pytest.raises(APIError) as failed:
                    await app.state.service.promote(hosted(app, "toy"), 0, "toy-again")
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
                signal.signal(signal.SIGXFSZ, previous)
            assert failed.value.status == 500
            assert failed.value.message.startswith(
                f"the promotion was not made: {root / 'default' / 'promotions.json'}"
            )
            assert (root / "default" / "promotions.json").read_bytes() == before
            assert [p.name for p in (root / "default").iterdir() if p.name.endswith(".tmp")] == []
            async with http(transport) as client:  # not served: a restart would not serve it
                served = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
            assert "toy-start" in served and "toy-again" not in served
            await model.close()

    asyncio.run(run())
