"""Many LoRA adapters on one base: each name answers with its own weights; swaps are atomic."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch
from adapters_support import make_adapter
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from grooves.adapters.admin import mount_admin
from grooves.adapters.promote import Promoter, watch_run
from grooves.cli import app as cli_app
from grooves.cli.adapters import parse_adapter_options
from grooves.config import LoraConfig
from grooves.policy.sampling import SamplingParams
from grooves.policy.transformers import TransformersPolicy
from grooves.serve.app import create_app, inprocess_client
from grooves.serve.routing import AdapterConflict, ModelRoutes

PROMPTS = [f"hello {i} world" for i in range(8)]


@pytest.fixture(scope="module")
def adapters(peaked_model_dir, tmp_path_factory):
    from tiny_models import build_tiny_model_dir

    root = tmp_path_factory.mktemp("adapters")
    made = {
        k: make_adapter(peaked_model_dir, root / k, seed=s, targets=("q_proj", "v_proj", "up_proj"))
        for k, s in (("a", 1), ("b", 2))
    }
    made["wide"] = make_adapter(
        build_tiny_model_dir(root / "wide-model", hidden_size=64), root / "wide"
    )  # another base
    return made


def _forward_logprobs(model, prompt_ids, token_ids) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + token_ids])  # [1, P+T]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()  # [P+T, V]
    lp = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)  # [T, V]
    return lp.gather(-1, torch.tensor(token_ids)[:, None]).squeeze(-1)


def _reference(peaked_model_dir, adapter_dir=None):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(peaked_model_dir).eval()
    return PeftModel.from_pretrained(model, str(adapter_dir)).eval() if adapter_dir else model


def _greedy(peaked_model_dir, adapter_dir, prompts) -> dict[str, list[int]]:
    """Greedy completions of `prompts` from a separate policy that has only this adapter."""
    policy = TransformersPolicy(str(peaked_model_dir), adapter_path=adapter_dir)
    ids = [policy.prompts.render([{"role": "user", "content": p}], None) for p in prompts]
    outs = policy.generate(ids, [SamplingParams(max_tokens=6, temperature=0)] * len(ids))
    return {p: o[0].token_ids for p, o in zip(prompts, outs, strict=True)}


def _ask(client, model, content, **extra):
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=6, **extra
    )


def test_two_adapters_at_once_give_their_own_outputs(peaked_model_dir, adapters):
    policy = TransformersPolicy(str(peaked_model_dir), served_name="tiny")
    table = ModelRoutes(policy)
    table.add("a", adapters["a"])
    table.add("b", adapters["b"])
    app = create_app(policy, adapters=table)
    assert [m["id"] for m in TestClient(app).get("/v1/models").json()["data"]] == ["tiny", "a", "b"]

    async def go():
        client = inprocess_client(app)
        names = ["tiny", "a", "b"] * 2
        return await asyncio.gather(*[_ask(client, n, "a story", temperature=1.0, seed=7) for n in names])

    responses = asyncio.run(go())
    by_name = {}
    for name, resp in zip(["tiny", "a", "b"] * 2, responses, strict=True):
        by_name.setdefault(name, []).append(resp.choices[0])
    refs = {
        "tiny": _reference(peaked_model_dir),
        "a": _reference(peaked_model_dir, adapters["a"]),
        "b": _reference(peaked_model_dir, adapters["b"]),
    }
    for name, choices in by_name.items():
        for c in choices:
            expected = _forward_logprobs(refs[name], c.prompt_token_ids, c.token_ids)
            assert (torch.tensor(c.sampled_logprobs) - expected).abs().max() < 1e-4, name
        assert choices[0].adapter_id == table.get(name).adapter_id
    # the same prompt, the same tokens: three different logprobs, one per set of weights
    c = by_name["a"][0]
    scores = [
        float(_forward_logprobs(refs[n], c.prompt_token_ids, c.token_ids).sum()) for n in ("tiny", "a", "b")
    ]
    assert min(abs(x - y) for i, x in enumerate(scores) for y in scores[i + 1 :]) > 0.1


def _admin_app(policy, **options):
    """An app with the /v1/adapters endpoints, as `grooves serve` builds it."""
    app = create_app(policy, **options)
    mount_admin(app)
    return app


def test_the_admin_endpoints_are_mounted_only_when_asked(peaked_model_dir):
    policy = TransformersPolicy(str(peaked_model_dir), served_name="tiny")
    assert TestClient(create_app(policy)).get("/v1/adapters").status_code == 404  # e.g. the trainer's own app
    assert [r["name"] for r in TestClient(_admin_app(policy)).get("/v1/adapters").json()["data"]] == ["tiny"]


def test_load_and_unload_at_run_time(peaked_model_dir, adapters):
    policy = TransformersPolicy(str(peaked_model_dir), served_name="tiny")
    app = _admin_app(policy)
    http = TestClient(app)
    body = {"model": "c", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}
    assert http.post("/v1/chat/completions", json=body).status_code == 404
    added = http.post("/v1/adapters", json={"name": "c", "path": str(adapters["a"])})
    assert added.status_code == 201 and added.json()["version"] == 1
    assert (
        http.post("/v1/chat/completions", json=body).json()["choices"][0]["adapter_id"]
        == added.json()["adapter_id"]
    )
    assert http.post("/v1/adapters", json={"name": "c", "path": str(adapters["b"])}).status_code == 409
    listed = {r["name"]: r for r in http.get("/v1/adapters").json()["data"]}
    assert (
        listed["c"]["path"] == str(adapters["a"])
        and listed["c"]["in_flight"] == 0
        and listed["tiny"]["adapter_id"] is None
    )
    bad = http.post("/v1/adapters", json={"name": "d", "path": str(peaked_model_dir)})
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    loaded = policy.adapters.loaded()
    wrong = http.post("/v1/adapters", json={"name": "d", "path": str(adapters["wide"])})
    assert wrong.status_code == 400 and "another base model" in wrong.json()["error"]["message"]
    assert policy.adapters.loaded() == loaded  # nothing half-loaded
    assert http.delete("/v1/adapters/c").json()["deleted"] is True
    app.state.adapters.wait_unloaded()
    assert http.post("/v1/chat/completions", json=body).status_code == 404
    assert policy.adapters.loaded() == [] and not hasattr(
        policy.model, "peft_config"
    )  # back to the plain base
    assert http.delete("/v1/adapters/tiny").status_code == 409


def test_promotion_during_concurrent_requests_loses_none_and_mixes_none(peaked_model_dir, adapters):
    greedy = {k: _greedy(peaked_model_dir, adapters[k], PROMPTS) for k in ("a", "b")}
    assert all(
        greedy["a"][p] != greedy["b"][p] for p in PROMPTS[:4]
    )  # the adapters are told apart by their outputs
    policy = TransformersPolicy(str(peaked_model_dir), served_name="tiny")
    table = ModelRoutes(policy)
    first = table.add("prod", adapters["a"])
    app = _admin_app(policy, adapters=table)
    n_requests = 48

    async def go():
        client = inprocess_client(app)
        admin = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://grooves.local", timeout=60
        )
        done: list = []

        async def worker(w):  # 8 clients, each sending its next request when the last one is answered
            out = []
            for k in range(n_requests // 8):
                i = w * (n_requests // 8) + k
                try:
                    out.append((i, await _ask(client, "prod", PROMPTS[i % len(PROMPTS)], temperature=0)))
                except Exception as exc:  # kept, so a lost request fails the test below
                    out.append((i, exc))
                done.append(i)
            return out

        tasks = [asyncio.create_task(worker(w)) for w in range(8)]
        while len(done) < 12:  # swap mid-stream: some requests answered, some in flight, most still to come
            await asyncio.sleep(0.002)
        promoted = await admin.post("/v1/adapters/prod/promote", json={"path": str(adapters["b"])})
        results = [r for t in await asyncio.gather(*tasks) for r in t]
        return promoted, dict(results)

    promoted, results = asyncio.run(go())
    assert promoted.status_code == 200, promoted.text
    second = promoted.json()
    assert second["version"] == 2 and second["history"] == [str(adapters["a"])]
    expected = {(first.adapter_id, 1): greedy["a"], (second["adapter_id"], 2): greedy["b"]}
    seen = set()
    assert sorted(results) == list(range(n_requests))
    for i, resp in results.items():
        assert not isinstance(resp, BaseException), resp  # none lost
        c = resp.choices[0]
        key = (c.adapter_id, c.adapter_version)
        assert key in expected, key  # id and version always belong together
        assert c.token_ids == expected[key][PROMPTS[i % len(PROMPTS)]], (i, key)  # none mixed
        seen.add(key)
    assert seen == set(expected)  # the swap happened while requests were flowing
    table.wait_unloaded()
    assert first.adapter_id not in policy.adapters.loaded()  # the old adapter was freed once drained

    back = TestClient(app).post("/v1/adapters/prod/rollback")
    assert (
        back.status_code == 200 and back.json()["version"] == 3 and back.json()["path"] == str(adapters["a"])
    )
    body = {
        "model": "prod",
        "messages": [{"role": "user", "content": PROMPTS[0]}],
        "max_tokens": 6,
        "temperature": 0,
    }
    assert (
        TestClient(app).post("/v1/chat/completions", json=body).json()["choices"][0]["token_ids"]
        == greedy["a"][PROMPTS[0]]
    )
    assert TestClient(app).post("/v1/adapters/prod/rollback").status_code == 409  # nothing earlier


def test_old_adapter_is_unloaded_only_when_its_requests_are_done(peaked_model_dir, adapters):
    policy = TransformersPolicy(str(peaked_model_dir), served_name="tiny")
    table = ModelRoutes(policy)
    promoter = Promoter(table)
    old = table.add("prod", adapters["a"])
    with table.lease("prod") as held:  # a request in flight on the old adapter
        new = promoter.promote("prod", adapters["b"])
        table.wait_unloaded()
        assert table.get("prod") == new and held == old
        assert old.adapter_id in policy.adapters.loaded()  # still there for the request that holds it
        prompt = policy.prompts.render([{"role": "user", "content": "hi"}], None)
        policy.generate([prompt], [SamplingParams(max_tokens=2, temperature=0)], adapter=held.adapter_id)
        assert table.in_flight(old.adapter_id) == 1
    table.wait_unloaded()
    assert policy.adapters.loaded() == [new.adapter_id]
    assert table.loaded_ids() == {new.adapter_id}


def test_the_training_adapter_keeps_training(peaked_model_dir, adapters):
    policy = TransformersPolicy(str(peaked_model_dir), lora=LoraConfig(rank=2, alpha=4), served_name="run")
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    prompt = policy.prompts.render([{"role": "user", "content": "hi"}], None)
    before = policy.generate([prompt], [SamplingParams(max_tokens=4, temperature=0)])[0][0]
    table = ModelRoutes(policy)
    extra = table.add("other", adapters["a"])
    policy.generate([prompt], [SamplingParams(max_tokens=4, temperature=0)], adapter=extra.adapter_id)
    assert {n for n, p in policy.model.named_parameters() if p.requires_grad} == trainable
    assert policy.model.active_adapter == "default"
    assert (
        policy.generate([prompt], [SamplingParams(max_tokens=4, temperature=0)])[0][0].token_ids
        == before.token_ids
    )
    policy.adapters.bump()
    assert table.version_of(table.get("run")) == 1  # the trainer's own name reports its step
    with pytest.raises(AdapterConflict, match="training adapter"):
        Promoter(table).promote("run", adapters["b"])


def test_watch_promotes_each_new_best(peaked_model_dir, adapters, tmp_path):
    from adapters_support import make_run

    run = make_run(tmp_path / "run", {1: 0.2, 2: 0.6}, model_dir=peaked_model_dir)
    promoted = watch_run(run, lambda path: None, interval_s=0.01, max_promotions=1)
    assert promoted == [run / "checkpoints" / "step_000002" / "adapter"]


def test_serve_options(peaked_model_dir, adapters):
    own, named = parse_adapter_options([str(adapters["a"]), f"x={adapters['b']}"], "tiny")
    assert own == adapters["a"] and named == [("x", adapters["b"])]
    with pytest.raises(ValueError, match="only one adapter can be unnamed"):
        parse_adapter_options([str(adapters["a"]), str(adapters["b"])], "tiny")
    with pytest.raises(ValueError, match="already served"):
        parse_adapter_options([f"tiny={adapters['a']}"], "tiny")
    result = CliRunner().invoke(
        cli_app, ["serve", "--model", str(peaked_model_dir), "--adapter", f"x={peaked_model_dir}"]
    )
    assert result.exit_code == 1 and "--adapter x=" in result.output


def test_an_adapter_with_nan_weights_is_refused(peaked_model_dir, adapters, tmp_path):
    import shutil

    from adapters_support import poison_adapter

    bad = tmp_path / "diverged"
    shutil.copytree(adapters["a"], bad)
    poison_adapter(bad)
    app = _admin_app(TransformersPolicy(str(peaked_model_dir), served_name="tiny"))
    http = TestClient(app)
    answer = http.post("/v1/adapters", json={"name": "d", "path": str(bad)})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (
        error["param"] == "path"
        and error["message"].startswith(f"{bad}: 1 of ")
        and "hold NaN or inf" in error["message"]
    )
    http.post("/v1/adapters", json={"name": "p", "path": str(adapters["a"])})
    assert http.post("/v1/adapters/p/promote", json={"path": str(bad)}).status_code == 400
    assert app.state.adapters.get("p").path == str(
        adapters["a"]
    )  # still served: the promotion never happened
    with pytest.raises(ValueError, match=r"--adapter x=.*hold NaN or inf"):
        parse_adapter_options([f"x={bad}"], "tiny")
