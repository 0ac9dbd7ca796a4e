"""The vLLM backend on the real engine (vLLM's CPU build, `make test-vllm`): logprobs, adapter versions,
the trainer's mismatch statistic, grammars, several adapters and promotion.

One engine serves the whole module: a trainable `VLLMPolicy` on a tiny random Llama whose heads
have 32 dimensions (the smallest vLLM's CPU attention has a kernel for). Every logprob vLLM reports
is checked against a plain transformers forward of the same ids with the same adapter.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

pytest.importorskip("vllm")

from grooves.adapters.admin import mount_admin  # noqa: E402
from grooves.config import LoraConfig, parse_config  # noqa: E402
from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup  # noqa: E402
from grooves.policy.sampling import SamplingParams  # noqa: E402
from grooves.policy.transformers import load_model  # noqa: E402
from grooves.serve.app import create_app, inprocess_client  # noqa: E402
from grooves.training.step import run_loss, train_step  # noqa: E402
from tiny_models import build_tiny_model_dir  # noqa: E402

pytestmark = pytest.mark.vllm

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("vllm-tiny"), hidden_size=128, init_std=0.2)


@pytest.fixture(scope="module")
def policy(model_dir, tmp_path_factory):
    from grooves.policy.vllm import VLLMPolicy

    policy = VLLMPolicy(
        str(model_dir),
        lora=LoraConfig(rank=4, alpha=8),
        dtype="float32",
        device="cpu",
        seed=0,
        served_name="tiny",
        kv_cache_gib=0.25,
        adapter_dir=tmp_path_factory.mktemp("adapters"),
    )
    yield policy
    policy.close()


def forward_logprobs(model, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / T) of each sampled token from one plain forward pass."""
    ids = torch.tensor([prompt + tokens])  # [1, P+T]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()  # [P+T, V]
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)  # [T, V]
    return logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)  # [T]


def max_gap(model, prompt, completions, temperature=1.0) -> float:
    return max(
        (torch.tensor(c.logprobs) - forward_logprobs(model, prompt, c.token_ids, temperature))
        .abs()
        .max()
        .item()
        for c in completions
    )


def new_adapter_weights(model, seed: int) -> None:
    """A stand-in for an optimizer step: every lora_B drawn anew (peft starts them at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def prompt_of(policy, text: str) -> list[int]:
    return policy.prompts.render([{"role": "user", "content": text}], None)


def test_each_version_reaches_the_engine_with_a_new_id_and_samples_are_the_trainers(policy):
    prompt = prompt_of(policy, "hello world")
    params = SamplingParams(n=4, max_tokens=12, temperature=1.0, seed=3)
    ids = []
    for version in range(3):
        if version:
            new_adapter_weights(policy.model, seed=version)
            assert policy.adapters.bump() == version
        ids.append(policy.adapters.publisher.current.lora_int_id)
        completions = policy.generate([prompt], [params])[0]
        assert len(completions) == 4 and all(len(c.token_ids) for c in completions)
        assert max_gap(policy.model, prompt, completions) < 1e-4, version  # float32 on both sides
    assert ids == [ids[0], ids[0] + 1, ids[0] + 2]


def test_a_stale_adapter_is_seen_in_the_logprobs(policy, monkeypatch):
    """The check above has teeth: an adapter published under a reused id (vLLM keeps serving what
    it cached under that id) gives logprobs far from the trainer's."""
    prompt = prompt_of(policy, "stale weights")
    params = SamplingParams(n=4, max_tokens=12, temperature=1.0, seed=5)
    policy.generate([prompt], [params])  # the current id is in the engine's cache
    current = policy.adapters.publisher.current
    new_adapter_weights(policy.model, seed=42)
    policy.adapters.bump()
    fresh = policy.adapters.publisher.current
    monkeypatch.setattr(
        policy.adapters.publisher,
        "current",
        type(fresh)(fresh.name, current.lora_int_id, fresh.path, fresh.version),
    )
    stale = policy.generate([prompt], [params])[0]
    assert max_gap(policy.model, prompt, stale) > 0.05
    monkeypatch.undo()
    assert max_gap(policy.model, prompt, policy.generate([prompt], [params])[0]) < 1e-4


def _group(policy, prompt, completions, rewards) -> TrajectoryGroup:
    version = policy.adapters.version
    trajs = [
        Trajectory(
            messages=[],
            turns=[
                SampledTurn(
                    prompt_token_ids=list(prompt),
                    token_ids=c.token_ids,
                    logprobs=c.logprobs,
                    adapter_version=version,
                    temperature=1.0,
                )
            ],
            reward=r,
        )
        for c, r in zip(completions, rewards, strict=True)
    ]
    return TrajectoryGroup(trajectories=trajs)


def test_the_trainers_mismatch_statistic_measures_vllms_logprobs(policy, model_dir, tmp_path):
    """mismatch_* compare the logprobs vLLM recorded with the trainer's: nonzero (not the trainer
    against itself), as large as a plain forward shows, and k3 a real KL estimate (k3 ~ d^2 / 2,
    so between max(d)^2 / (2 N) and max(d)^2 / 2), not float32 rounding noise."""
    config = parse_config(
        {
            "model": {"base_model": str(model_dir), "backend": "vllm"},
            "rollout": {"group_size": 8, "groups_per_step": 1, "max_tokens": 16},
            "optim": {"lr": 1e-3},
            "lora": {"rank": 4, "alpha": 8},
        }
    )
    prompt = prompt_of(policy, "what is the capital of France?")
    completions = policy.generate([prompt], [SamplingParams(n=8, max_tokens=16, temperature=1.0, seed=11)])[0]
    gaps = torch.cat(
        [torch.tensor(c.logprobs) - forward_logprobs(policy.model, prompt, c.token_ids) for c in completions]
    )
    version = policy.adapters.version
    optimizer = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=1e-3)
    rewards = [float(i % 2) for i in range(8)]
    stats, seqs = train_step(
        policy, optimizer, [_group(policy, prompt, completions, rewards)], config, run_loss(config)
    )
    n = sum(s.num_sampled for s in seqs)
    d_max = stats["mismatch_abs_max"]
    assert 0.0 < d_max < 1e-4 and gaps.abs().max().item() < 1e-4
    assert d_max**2 / (2 * n) * 0.9 < stats["mismatch_k3_mean"] < d_max**2 / 2 * 1.1
    assert abs(stats["mismatch_k1_mean"]) <= d_max
    assert policy.adapters.version == version + 1


def test_response_format_and_forced_tool_choice_run_on_vllms_structured_outputs(policy):
    app = create_app(policy, max_n=8)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }

    async def go():
        client = inprocess_client(app)
        json_reply = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "weather?"}],
            n=3,
            max_tokens=60,
            seed=1,
            response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
        )
        forced = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "weather in Paris?"}],
            n=2,
            max_tokens=60,
            seed=2,
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
        return json_reply, forced

    json_reply, forced = asyncio.run(go())
    for choice in json_reply.choices:
        assert choice.finish_reason == "stop", choice.message.content
        value = json.loads(choice.message.content)
        assert set(value) == {"city", "sunny"} and isinstance(value["sunny"], bool)
    for choice in forced.choices:
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather" and set(json.loads(call.function.arguments)) == {"city"}
    # the recorded logprob is the masked distribution's, never below the unmasked one the trainer computes
    c = json_reply.choices[0]
    extra = c.model_extra
    unmasked = forward_logprobs(policy.model, extra["prompt_token_ids"], extra["token_ids"])
    assert (torch.tensor(extra["sampled_logprobs"]) - unmasked).min().item() > -1e-4


def _save_adapter(model_dir, folder, seed: int):
    """A rank-4 adapter of the tiny model with random B, saved by peft (the policy's own is untouched)."""
    model, _ = load_model(str(model_dir), lora=LoraConfig(rank=4, alpha=8))
    new_adapter_weights(model, seed)
    model.save_pretrained(str(folder))
    return folder


def test_several_adapters_are_served_and_promotion_switches_the_weights(policy, model_dir, tmp_path):
    first = _save_adapter(model_dir, tmp_path / "first", seed=7)
    second = _save_adapter(model_dir, tmp_path / "second", seed=8)
    app = create_app(policy, max_n=8)
    mount_admin(app)
    references = {}
    for name, folder in (("first", first), ("second", second)):
        model, _ = load_model(str(model_dir), adapter_path=folder)
        references[name] = model

    async def sample(client, model):
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hello"}], n=2, max_tokens=10, seed=4
        )
        return reply.choices

    async def go():
        client = inprocess_client(app)
        http = client._client
        added = await http.post("/v1/adapters", json={"name": "support", "path": str(first)})
        assert added.status_code == 201, added.text
        before = await sample(client, "support")
        promoted = await http.post("/v1/adapters/support/promote", json={"path": str(second)})
        assert promoted.status_code == 200, promoted.text
        after = await sample(client, "support")
        own = await sample(client, "tiny")
        return before, after, own

    before, after, own = asyncio.run(go())
    for choices, reference in ((before, references["first"]), (after, references["second"])):
        for c in choices:
            extra = c.model_extra
            expected = forward_logprobs(reference, extra["prompt_token_ids"], extra["token_ids"])
            assert (torch.tensor(extra["sampled_logprobs"]) - expected).abs().max().item() < 1e-4
    assert before[0].model_extra["adapter_id"] != after[0].model_extra["adapter_id"]
    assert own[0].model_extra["adapter_id"] is None
    extra = own[0].model_extra
    expected = forward_logprobs(policy.model, extra["prompt_token_ids"], extra["token_ids"])
    assert (torch.tensor(extra["sampled_logprobs"]) - expected).abs().max().item() < 1e-4


@pytest.mark.slow
def test_smollm2_answers_on_vllm_and_its_logprobs_are_the_trainers():
    """The real SmolLM2-135M (`make test-vllm-slow`): a sampling-only policy, greedy and sampled."""
    from grooves.models import ensure_model
    from grooves.policy.vllm import VLLMPolicy

    base = ensure_model()
    policy = VLLMPolicy(str(base), lora=None, dtype="float32", device="cpu", served_name="smollm2")
    try:
        prompt = prompt_of(policy, "What is the capital of France?")
        greedy = policy.generate([prompt], [SamplingParams(max_tokens=24, temperature=0.0)])[0][0]
        assert "Paris" in greedy.text, greedy.text
        sampled = policy.generate([prompt], [SamplingParams(n=4, max_tokens=24, temperature=1.0, seed=0)])[0]
    finally:
        policy.close()
    model, _ = load_model(str(base))
    assert max_gap(model, prompt, sampled) < 1e-4
