"""The training service on a tiny model: a step through it is the trainer's step, retries apply once,
bad groups are refused naming the field, tenants see only their own models, usage is metered."""

from __future__ import annotations

import asyncio
import copy
import json

import httpx
import pytest
import torch
from openai import AsyncOpenAI, BadRequestError
from service_support import TOY, adapter, create, hosted, http, rows, service, toy_config

from grooves.config import parse_config
from grooves.policy import policy_for
from grooves.remote import ServiceError, TrainableModel
from grooves.remote.wire import to_records
from grooves.rollouts.gather import TooManyFailures, gather
from grooves.rollouts.handle import ModelHandle
from grooves.serve.app import inprocess_client
from grooves.serve.keys import ApiKeys
from grooves.tasks.toy import ToyTokensTask
from grooves.training.checkpoint import seed_everything
from grooves.training.data import ScenarioStream
from grooves.training.loop import train
from grooves.training.optim import adamw
from grooves.training.step import reward_stats, run_loss, train_step

TASK = ToyTokensTask(**TOY)


def _scenarios(k: int = 2) -> list[dict]:
    return TASK.scenarios("train")[:k]


# ---- exactness ---------------------------------------------------------------------------------
def test_a_step_through_the_service_equals_the_trainers_step_on_the_same_groups(tiny_model_dir, tmp_path):
    """Two steps: the same first adapter, then the same metrics and the same updated adapter, bit for bit."""
    data = toy_config(tiny_model_dir)
    config = parse_config(data)
    seed_everything(config.seed)  # the trainer's start (`training.loop.run`)
    policy = policy_for(config.model, config.lora, seed=config.seed, served_name="toy")
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = adamw(
        params, lr=config.optim.lr, betas=config.optim.betas, weight_decay=config.optim.weight_decay
    )
    loss = run_loss(config)

    async def run():
        client = inprocess_client(policy)
        handle = ModelHandle(client, "toy", 1.0, 1.0, 4, seed=config.seed)
        async with service(tmp_path / "svc", tiny_model_dir) as (app, transport):
            model = await create(transport, "toy", data)
            theirs = hosted(app, "toy").policy
            assert _equal(adapter(policy), adapter(theirs))  # created as the trainer creates its policy
            for step in (1, 2):
                groups = await gather(TASK.rollout, handle, _scenarios(), 4, progress=False, seed_key=(step,))
                stats, _ = train_step(policy, optimizer, groups, config, loss)
                result = await model.train(groups)
                assert (result.step, result.adapter_version) == (step, step)
                assert {k: result.metrics[k] for k in stats} == stats  # loss, grad norm, clip fraction...
                assert stats["grad_norm"] > 0
                assert _equal(adapter(policy), adapter(theirs))
            await model.close()
        await client.close()

    asyncio.run(run())


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_loop_through_the_service_trains_as_the_in_process_trainer(tiny_model_dir, tmp_path):
    """The client's `gather` seeds rollouts as the trainer does: the same samples, rewards and losses."""
    data = toy_config(tiny_model_dir)
    config = parse_config(
        {**data, "task": "toy_tokens", "task_options": TOY, "steps": 2, "output_dir": str(tmp_path / "run")}
        | {"validation": {"every": 0, "scenarios": 2}}
    )
    trained = {r["step"]: r for r in rows(train(config) / "metrics.jsonl") if "loss" in r}

    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (_, transport):
            model = await create(transport, "toy", config)
            stream = ScenarioStream(TASK.scenarios("train"), config.seed)
            for step in (1, 2):
                groups = await model.gather(TASK.rollout, [s for _, s in stream.take(2)])
                metrics = (await model.train(groups)).metrics
                same = {  # refills are the loop's own sampling: the service trains what it is sent
                    k: v
                    for k, v in trained[step].items()
                    if not k.startswith(("seconds_", "val/", "watch/"))
                    and k not in ("refill_draws", "sparse_rewards")
                }
                assert {k: metrics[k] for k in same} == same
            await model.close()

    asyncio.run(run())


def test_the_clients_gather_records_failed_rollouts_and_stops_past_the_limit(tiny_model_dir, tmp_path):
    """A rollout that raises is a failed trajectory, counted by the step and not trained on, as in the
    trainer; past `max_failure_fraction` the gather raises and nothing is sent."""
    calls = 0

    async def flaky(handle, scenario):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise TimeoutError("judge did not answer")
        return await TASK.rollout(handle, scenario)

    async def broken(handle, scenario):
        raise ConnectionError("environment down")

    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (_, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            groups = await model.gather(flaky, _scenarios())
            assert [t.error for g in groups for t in g.trajectories if t.error] == [
                "TimeoutError: judge did not answer"
            ]
            result = await model.train(groups)
            assert (result.metrics["rollouts"], result.metrics["failed_rollouts"]) == (8.0, 1.0)
            assert {k: result.metrics[k] for k in reward_stats(groups)} == reward_stats(groups)
            with pytest.raises(
                TooManyFailures, match=r"8/8 rollouts failed .*ConnectionError: environment down"
            ):
                await model.gather(broken, _scenarios())
            assert model.step == 1 and (await model.info())["step"] == 1
            await model.close()

    asyncio.run(run())


# ---- idempotence -------------------------------------------------------------------------------
class DropFirstStepAnswer(httpx.AsyncBaseTransport):
    """Delivers the first training step to the app, lets it answer, then loses the answer."""

    def __init__(self, inner: httpx.AsyncBaseTransport):
        self.inner, self.dropped = inner, 0

    async def handle_async_request(self, request):
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/steps") and not self.dropped:
            await response.aread()  # the server has applied the step and answered
            self.dropped += 1
            raise httpx.ReadError("connection reset by peer", request=request)
        return response


def test_a_step_whose_answer_was_lost_is_applied_once(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (app, transport):
            dropping = DropFirstStepAnswer(transport)
            model = await create(dropping, "toy", toy_config(tiny_model_dir))
            reference = await create(transport, "ref", toy_config(tiny_model_dir))
            groups = await model.gather(TASK.rollout, _scenarios())
            result = await model.train(groups)  # sent twice: the second answer is the first's
            assert dropping.dropped == 1 and result.replayed
            assert (result.step, model.step, hosted(app, "toy").step) == (1, 1, 1)
            once = await reference.train(groups)
            assert not once.replayed
            assert result.metrics["loss"] == once.metrics["loss"]
            assert _equal(adapter(hosted(app, "toy").policy), adapter(hosted(app, "ref").policy))
            assert [r["step"] for r in rows(tmp_path / "svc" / "default" / "toy" / "metrics.jsonl")] == [1]
            for m in (model, reference):
                await m.close()

    asyncio.run(run())


def test_step_ids_that_are_not_the_next_are_refused(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (_, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            groups = await model.gather(TASK.rollout, _scenarios())
            with pytest.raises(ServiceError) as ahead:
                await model.train(groups, step=3)
            assert (ahead.value.status, ahead.value.param, ahead.value.code) == (409, "step", "step_conflict")
            assert "the next step id is 1" in ahead.value.message
            await model.train(groups)
            other = await model.gather(TASK.rollout, _scenarios(), step=2)
            with pytest.raises(ServiceError) as again:
                await model.train(other, step=1)  # step 1 again, with other groups
            assert again.value.status == 409 and "already applied with other groups" in again.value.message
            assert model.step == 1
            await model.close()

    asyncio.run(run())


# ---- what crosses the wire, and what is refused ------------------------------------------------
def _bad(record: dict, path: str, value) -> dict:
    """`record` (a training request) with the field at dotted `path` set to `value`."""
    out = copy.deepcopy(record)
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = out
    for p in parents:
        node = node[p]
    node[last] = value
    return out


BAD_GROUPS = [
    (
        "groups.0.trajectories.1.turns.0.token_ids.0",
        99_999,
        "groups[0].trajectories[1].turns[0].token_ids[0]",
        "99999 is not a token id of this model",
    ),
    (
        "groups.1.trajectories.0.turns.0.prompt_token_ids.0",
        -1,
        "groups[1].trajectories[0].turns[0].prompt_token_ids[0]",
        "is not a token id",
    ),
    (
        "groups.0.trajectories.0.turns.0.logprobs",
        [-0.5, -0.5, -0.5, -0.5, -0.5],
        "groups[0].trajectories[0].turns[0].logprobs",
        "5 logprobs for",
    ),
    (
        "groups.0.trajectories.0.turns.0.logprobs.0",
        0.7,
        "groups[0].trajectories[0].turns[0].logprobs[0]",
        "not a log-probability",
    ),
    (
        "groups.0.trajectories.2.turns.0.adapter_version",
        1,
        "groups[0].trajectories[2].turns[0].adapter_version",
        "newer than the model's live adapter (version 0)",
    ),
    ("groups.0.trajectories.0.turns", [], "groups[0].trajectories[0].turns", "at least one sampled turn"),
    ("groups.0.trajectories.0.reward", "NaN", "groups.0.trajectories.0.reward", "finite number"),
    ("groups.0.trajectories.0.messages", [{"role": "user"}], "groups.0.trajectories.0.messages", "Extra"),
    ("groups.0.trajectories.0.turns.0.text", "Paris", "groups.0.trajectories.0.turns.0.text", "Extra"),
]
"""(field to change, its bad value, the `param` of the 400, what its message says)."""


def test_a_bad_group_is_refused_naming_the_field(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (app, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            good = {"step": 1, "groups": to_records(await model.gather(TASK.rollout, _scenarios()))}
            async with http(transport) as client:
                for path, value, param, says in BAD_GROUPS:
                    body = json.dumps(_bad(good, path, value)).replace('"NaN"', "NaN")
                    resp = await client.post(
                        "/v1/trainable_models/toy/steps",
                        content=body,
                        headers={"Content-Type": "application/json"},
                    )
                    error = resp.json()["error"]
                    assert resp.status_code == 400, error
                    assert error["param"] == param and says in error["message"], error
                assert hosted(app, "toy").step == 0  # nothing was trained
                resp = await client.post("/v1/trainable_models/toy/steps", json=good)
                assert resp.status_code == 200 and resp.json()["step"] == 1  # the same request, unchanged
            await model.close()

    asyncio.run(run())


def test_turns_older_than_max_staleness_are_refused(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (_, transport):
            strict = await create(transport, "strict", toy_config(tiny_model_dir))
            loose = await create(transport, "loose", toy_config(tiny_model_dir, rollout={"max_staleness": 1}))
            info = await loose._call("GET", "/v1/trainable_models/loose")
            assert info["config"]["rollout"]["max_staleness"] == 1 and "max_staleness" not in info
            for model in (strict, loose):
                first = await model.gather(TASK.rollout, _scenarios())
                await model.train(first)
                stale = await model.gather(TASK.rollout, _scenarios(), step=2)
                for g in stale:  # as if sampled before step 1 was applied
                    for t in g.trajectories:
                        t.turns[0].adapter_version = 0
                if model is strict:
                    with pytest.raises(ServiceError) as refused:
                        await model.train(stale)
                    assert refused.value.status == 400
                    assert refused.value.param == "groups[0].trajectories[0].turns[0].adapter_version"
                    assert "1 versions behind the live adapter (version 1)" in refused.value.message
                    assert "at most 0 behind (rollout.max_staleness)" in refused.value.message
                else:
                    assert (await model.train(stale)).step == 2
                await model.close()

    asyncio.run(run())


def test_max_staleness_outside_the_rollout_table_is_refused_naming_where_it_goes(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (app, transport):
            with pytest.raises(TypeError, match=r"max_staleness is the run file's rollout\.max_staleness"):
                await create(transport, "toy", toy_config(tiny_model_dir), max_staleness=1)
            async with http(transport) as client:
                resp = await client.post(
                    "/v1/trainable_models",
                    json={"name": "toy", "config": toy_config(tiny_model_dir), "max_staleness": 1},
                )
            error = resp.json()["error"]
            assert resp.status_code == 400 and error["param"] == "max_staleness", error
            assert "send it as config.rollout.max_staleness" in error["message"], error
            assert hosted(app, "toy") is None  # nothing was created

    asyncio.run(run())


@pytest.mark.parametrize(
    "config,param,says",
    [
        ({"task": "capitals"}, "config.task", "not taken by a trainable model"),
        ({"lora": {"rank": 0}}, "config.lora.rank", "greater than or equal to 1"),
        ({"model": {"base_model": "smollm2-135m-other"}}, "config.model.base_model", "this service runs"),
        ({"model": {"dtype": "bfloat16"}}, "config.model.dtype", "this service runs 'float32'"),
        (
            {"model": {"init_adapter": "/srv/other/checkpoints/step_000001"}},
            "config.model.init_adapter",
            "fresh adapter",
        ),
        (
            {"lora": {"target_modules": ["qkv"]}},
            "config.lora.target_modules",
            "'qkv' is no layer of this model",
        ),
    ],
)
def test_a_bad_model_config_is_refused_naming_the_field(tiny_model_dir, tmp_path, config, param, says):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (app, transport), http(transport) as client:
            resp = await client.post("/v1/trainable_models", json={"name": "toy", "config": config})
            error = resp.json()["error"]
            assert resp.status_code == 400 and error["param"] == param and says in error["message"], error
            assert len(app.state.service.models) == 0 and not (tmp_path / "svc" / "default" / "toy").exists()

    asyncio.run(run())


def test_an_unknown_route_lists_the_services_routes_too(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (_, transport), http(transport) as client:
            missing = await client.get("/v1/completions")
            assert missing.status_code == 404
            message = missing.json()["error"]["message"]
            assert message.startswith("no route GET /v1/completions; this server has /v1/models")
            assert "/v1/trainable_models" in message and "/v1/chat/completions" in message

    asyncio.run(run())


def test_model_names_are_checked_and_exist_ok_connects(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (_, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            with pytest.raises(ServiceError) as exists:
                await create(transport, "toy", toy_config(tiny_model_dir))
            assert (exists.value.status, exists.value.code) == (409, "model_exists")
            again = await create(transport, "toy", toy_config(tiny_model_dir), exist_ok=True)
            assert again.step == 0
            with pytest.raises(ServiceError) as other:
                await create(transport, "toy", toy_config(tiny_model_dir, optim={"lr": 1e-3}), exist_ok=True)
            assert "exists with other settings" in other.value.message
            for bad in ("../up", str(tiny_model_dir)):  # a path; the base model's own served name
                with pytest.raises(ServiceError) as refused:
                    await create(transport, bad, toy_config(tiny_model_dir))
                assert refused.value.param == "name"
            for m in (model, again):
                await m.close()

    asyncio.run(run())


def test_a_model_past_max_models_is_refused_and_leaves_no_folder(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir, max_models=1) as (app, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            with pytest.raises(ServiceError) as refused:
                await create(transport, "other", toy_config(tiny_model_dir))
            assert (refused.value.status, refused.value.code) == (409, "max_models")
            assert "at most 1 trainable models (--max-models)" in refused.value.message
            assert len(app.state.service.models) == 1
            assert not (tmp_path / "svc" / "default" / "other").exists()
            await model.close()

    asyncio.run(run())


# ---- tenants and metering ----------------------------------------------------------------------
KEYS = {"alice": "alice-secret-key", "bob": "bob-secret-key"}


def test_each_key_sees_and_trains_only_its_own_models(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir, keys=ApiKeys(KEYS)) as (app, transport):
            alice = await create(transport, "toy", toy_config(tiny_model_dir), api_key=KEYS["alice"])
            groups = await alice.gather(TASK.rollout, _scenarios())
            await alice.train(groups)
            await alice.promote(1, "toy-live")
            body = {"step": 2, "groups": to_records(groups)}
            async with http(transport, KEYS["bob"]) as bob:
                chat = {"model": "toy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
                for method, path, payload in [
                    ("POST", "/v1/chat/completions", chat),  # sample
                    ("POST", "/v1/chat/completions", {**chat, "model": "toy-live"}),  # her promoted adapter
                    ("POST", "/v1/trainable_models/toy/steps", body),  # train
                    ("GET", "/v1/trainable_models/toy", None),
                    ("GET", "/v1/trainable_models/toy/checkpoints", None),  # list
                    ("POST", "/v1/trainable_models/toy/checkpoints/0/select", None),
                    ("DELETE", "/v1/trainable_models/toy/checkpoints/0", None),
                    ("POST", "/v1/trainable_models/toy/promote", {"step": 1}),  # promote
                ]:
                    resp = await bob.request(method, path, json=payload)
                    assert resp.status_code == 404, (method, path, resp.text)
                    assert (
                        "toy" not in resp.json()["error"]["message"].split("yours")[-1].split("available")[-1]
                    )
                listed = (await bob.get("/v1/trainable_models")).json()["data"]
                models = [m["id"] for m in (await bob.get("/v1/models")).json()["data"]]
                assert listed == [] and models == [str(tiny_model_dir)]
                assert (await bob.get("/v1/usage")).json()["data"] == []
            async with http(transport) as nobody, http(transport, "not-a-key-at-all") as stranger:
                for client in (nobody, stranger):
                    resp = await client.get("/v1/trainable_models")
                    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
            # bob's own model of the same name is his, and leaves hers as it was
            before = adapter(hosted(app, "toy", "alice").policy)
            bobs = await create(transport, "toy", toy_config(tiny_model_dir), api_key=KEYS["bob"])
            await bobs.train(await bobs.gather(TASK.rollout, _scenarios()))
            assert (hosted(app, "toy", "alice").step, hosted(app, "toy", "bob").step) == (1, 1)
            assert _equal(before, adapter(hosted(app, "toy", "alice").policy))
            assert (tmp_path / "svc" / "alice" / "toy").is_dir() and (
                tmp_path / "svc" / "bob" / "toy"
            ).is_dir()
            for m in (alice, bobs):
                await m.close()

    asyncio.run(run())


def test_a_stored_response_belongs_to_the_key_that_made_it(tiny_model_dir, tmp_path):
    """bob sending alice's response id as previous_response_id gets the 400 an unknown id gets (none of
    her conversation in his prompt); alice continues it. Streamed or not."""
    unknown = "resp_" + "0" * 32

    async def run():
        async with service(tmp_path / "svc", tiny_model_dir, keys=ApiKeys(KEYS)) as (app, transport):

            def openai(tenant: str) -> AsyncOpenAI:
                http_client = httpx.AsyncClient(transport=transport, base_url="http://svc")
                return AsyncOpenAI(
                    base_url="http://svc/v1", api_key=KEYS[tenant], http_client=http_client, max_retries=0
                )

            alice, bob = openai("alice"), openai("bob")
            model = str(tiny_model_dir)
            said = await alice.responses.create(model=model, input="my secret", max_output_tokens=3)
            async with await alice.responses.create(
                model=model, input="my other secret", max_output_tokens=3, stream=True
            ) as events:
                streamed = [e async for e in events][-1].response
            for kept in (said, streamed):
                refusals = []
                for response_id in (kept.id, unknown):
                    with pytest.raises(BadRequestError) as refused:
                        await bob.responses.create(
                            model=model, input="hi", previous_response_id=response_id, max_output_tokens=3
                        )
                    refusals.append(json.dumps(refused.value.body).replace(response_id, "<id>"))
                assert refusals[0] == refusals[1] and "previous_response_id" in refusals[0]
                go_on = await alice.responses.create(
                    model=model, input="and then", previous_response_id=kept.id, max_output_tokens=3
                )
                theirs = kept.model_extra
                mine = go_on.model_extra["prompt_token_ids"]
                assert mine[: len(theirs["prompt_token_ids"])] == theirs["prompt_token_ids"]
            await bob.close()
            await alice.close()

    asyncio.run(run())


def test_usage_counts_tokens_sampled_and_trained_per_key_and_model(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir, keys=ApiKeys(KEYS)) as (app, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir), api_key=KEYS["alice"])
            openai = model.openai_client()
            resp = await openai.chat.completions.create(
                model="toy", messages=[{"role": "user", "content": "hello world"}], n=3, max_tokens=3
            )
            prompt, sampled = resp.usage.prompt_tokens, resp.usage.completion_tokens
            groups = await model.gather(TASK.rollout, _scenarios())
            trajs = [t for g in groups for t in g.trajectories]
            prompt += sum(len(t.turns[0].prompt_token_ids) for t in trajs)
            sampled += sum(len(t.turns[0].token_ids) for t in trajs)
            await model.train(groups)
            trained = sum(  # the sequences of groups whose rewards differ: the others are dropped
                len(t.turns[0].prompt_token_ids) + len(t.turns[0].token_ids)
                for g in groups
                if len(set(g.rewards)) > 1
                for t in g.trajectories
            )
            usage = await model.usage()
            expect = {
                "prompt_tokens": prompt,
                "sampled_tokens": sampled,
                "trained_tokens": trained,
                "steps": 1,
            }
            assert usage["tenant"] == "alice" and usage["total"] == expect
            assert usage["data"] == [{"model": "toy", **expect}]
            (line,) = rows(tmp_path / "svc" / "alice" / "toy" / "usage.jsonl")  # one line per step
            assert line == {"step": 1, "tenant": "alice", **{k: expect[k] for k in list(expect)[:3]}}
            async with http(transport, KEYS["bob"]) as bob:
                assert (await bob.get("/v1/usage")).json()["total"]["sampled_tokens"] == 0
            await model.close()

    asyncio.run(run())


# ---- checkpoints and promotion -----------------------------------------------------------------
def test_checkpoints_can_be_listed_selected_deleted_and_promoted(tiny_model_dir, tmp_path):
    async def run():
        async with service(tmp_path / "svc", tiny_model_dir, reports=True) as (app, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            first = [await model.train(await model.gather(TASK.rollout, _scenarios())) for _ in range(2)]
            listed = await model.checkpoints()
            assert [c["step"] for c in listed] == [0, 1, 2]
            assert listed[2]["metrics"]["loss"] == first[1].metrics["loss"]
            with pytest.raises(ServiceError) as latest:
                await model.delete_checkpoint(2)
            assert (latest.value.status, latest.value.code) == (409, "latest_checkpoint")

            served = await model.promote(1)
            assert (served["name"], served["step"]) == ("toy-promoted", 1)
            at_two = adapter(hosted(app, "toy").policy)
            await model.select(1)
            assert model.step == 1 and [c["step"] for c in await model.checkpoints()] == [0, 1]
            assert not _equal(at_two, adapter(hosted(app, "toy").policy))
            # from checkpoint 1, the same groups give the same step 2 again
            again = await model.train(await model.gather(TASK.rollout, _scenarios()))
            assert again.step == 2 and again.metrics["loss"] == first[1].metrics["loss"]
            await model.delete_checkpoint(0)
            assert [c["step"] for c in await model.checkpoints()] == [1, 2]

            # the promoted adapter answers under its own name, frozen at step 1
            openai = model.openai_client()
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "seed": 5}
            promoted = (await openai.chat.completions.create(model="toy-promoted", **chat)).choices[0]
            live = (await openai.chat.completions.create(model="toy", **chat)).choices[0]
            assert promoted.model_extra["adapter_id"] != live.model_extra["adapter_id"]
            assert live.model_extra["adapter_version"] == 2
            replaced = await model.promote(2)
            assert (replaced["name"], replaced["version"]) == ("toy-promoted", 2)
            await model.close()

    asyncio.run(run())
    run_dir = tmp_path / "svc" / "default" / "toy"  # a trainer's run folder, report included
    assert [r["step"] for r in rows(run_dir / "metrics.jsonl")] == [1, 2]
    for name in ("config.toml", "reward_curve.png", "report.html", "samples/step_000002.jsonl"):
        assert (run_dir / name).is_file(), name
    samples = [
        json.loads(line) for line in (run_dir / "samples" / "step_000002.jsonl").read_text().splitlines()
    ]
    texts = [t["turns"][0]["text"] for g in samples for t in g["trajectories"]]
    assert len(texts) == 8 and any(texts)  # decoded from the token ids, for the reader


def test_a_model_checkpoints_and_keeps_as_its_checkpoint_section_says(tiny_model_dir, tmp_path):
    """`[checkpoint]` is one of the sections a trainable model takes: every 2 steps, the newest 2 kept."""

    async def run():
        async with service(tmp_path / "svc", tiny_model_dir) as (app, transport):
            config = toy_config(tiny_model_dir, checkpoint={"every": 2, "keep": 2})
            model = await create(transport, "toy", config)
            for _ in range(5):
                await model.train(await model.gather(TASK.rollout, _scenarios()))
            kept = [c["step"] for c in await model.checkpoints()]
            await model.close()
            return kept, hosted(app, "toy").config.checkpoint

    kept, settings = asyncio.run(run())
    assert kept == [2, 4] and (settings.every, settings.keep) == (2, 2)


def test_a_model_the_service_could_not_restore_is_kept_not_replaced(tiny_model_dir, tmp_path, capfd):
    root = tmp_path / "svc"

    async def run():
        async with service(root, tiny_model_dir) as (_, transport):
            model = await create(transport, "toy", toy_config(tiny_model_dir))
            await model.train(await model.gather(TASK.rollout, _scenarios()))
            await model.close()
        for damaged in root.glob("default/toy/checkpoints/*/optimizer.pt"):
            damaged.write_bytes(b"cut short")
        async with service(root, tiny_model_dir) as (app, transport):
            assert hosted(app, "toy") is None
            with pytest.raises(ServiceError) as refused:
                await create(transport, "toy", toy_config(tiny_model_dir))
            assert refused.value.code == "model_exists" and "could not restore" in refused.value.message
        assert [r["step"] for r in rows(root / "default" / "toy" / "metrics.jsonl")] == [1]  # untouched

    asyncio.run(run())
    assert "default/toy: not restored: no intact checkpoint" in capfd.readouterr().err


def test_stale_turns_under_tis_train_on_their_own_weights_until_a_restart_forgets_them(
    tiny_model_dir, tmp_path
):
    """algorithm.tis_cap with rollout.max_staleness: the service keeps the versions a step's turns may
    come from; after a restart it no longer holds them, and says so (409) before changing anything."""
    config = toy_config(tiny_model_dir, algorithm={"tis_cap": 2.0}, rollout={"max_staleness": 1})
    root = tmp_path / "svc"

    async def run():
        async with service(root, tiny_model_dir) as (app, transport):
            model = await create(transport, "toy", config)
            groups = await model.gather(TASK.rollout, _scenarios())  # sampled by version 0
            await model.train(groups)
            second = await model.gather(TASK.rollout, _scenarios())  # by version 1
            stale = await model.train(second[:1] + groups[1:])  # a group of version 0, one behind
            assert stale.step == 2 and stale.metrics["staleness_max"] == 1.0
            await model.close()
        async with service(root, tiny_model_dir) as (app, transport):
            model = await TrainableModel.connect("http://svc", "toy", transport=transport)
            before = adapter(hosted(app, "toy").policy)
            with pytest.raises(ServiceError) as err:
                await model.train(second)  # version 1's turns: the restarted service holds only 2
            assert err.value.status == 409
            assert "adapter versions [1], whose weights this trainer no longer holds" in str(err.value)
            after = adapter(hosted(app, "toy").policy)
            assert hosted(app, "toy").step == 2 and all(torch.equal(before[k], after[k]) for k in before)
            await model.close()

    asyncio.run(run())
