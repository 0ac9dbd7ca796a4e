"""The Tinker API of `grooves serve --train`, driven by the real, unchanged `tinker` SDK (pinned in
the dev extra) over HTTP, on a tiny model."""

from __future__ import annotations

import math
import re

import httpx
import numpy as np
import pytest

tinker = pytest.importorskip("tinker", reason="the Tinker SDK: the dev extra (make setup) installs it")

import torch  # noqa: E402
from tests.training_service.tinker_support import ALICE, BOB, client, rl_datum, tinker_server, trained  # noqa: E402
from tinker import types  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from grooves.config import parse_config  # noqa: E402
from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup  # noqa: E402
from grooves.policy import policy_for  # noqa: E402
from grooves.training.checkpoint import seed_everything  # noqa: E402
from grooves.training.optim import adamw  # noqa: E402
from grooves.training.step import run_loss, train_step  # noqa: E402

PROMPT = [5, 17, 42, 9, 33]
COMPLETIONS = [[61, 62, 63], [70, 71]]
SAMPLED_LP = [[-6.1, -5.9, -6.3], [-6.2, -6.0]]
"""Two rollouts of one prompt with the sampler's logprobs (not the trainer's: the ratio is not 1)."""


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    with tinker_server(tmp_path_factory.mktemp("tinker-svc"), tiny_model_dir) as (url, app):
        yield url, app


def _grooves_side(model_dir):
    """grooves' own trainer on the same first adapter: rank 4, alpha 8, seed 3, PPO clip 0.2 / 0.28,
    advantages r - mean(r), the "constant" aggregation over 2 rollouts x 1 token (a sum / 2)."""
    data = {
        "seed": 3,
        "model": {"base_model": str(model_dir)},
        "lora": {"rank": 4, "alpha": 8.0},
        "rollout": {"group_size": 2, "groups_per_step": 1, "max_tokens": 1},
        "algorithm": {"advantage": "grpo", "scale_by_std": False, "aggregation": "constant"},
        "optim": {"lr": 1e-2, "betas": [0.9, 0.99], "weight_decay": 0.0, "grad_clip": 1e6},
    }
    config = parse_config(data)
    seed_everything(config.seed)
    policy = policy_for(config.model, config.lora, seed=config.seed, served_name="toy")
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = adamw(params, lr=config.optim.lr, betas=config.optim.betas, weight_decay=0.0)
    return config, policy, optimizer


def _mine(policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}


def test_a_tinker_step_equals_grooves_own_step_on_the_same_tokens_and_advantages(server, tiny_model_dir):
    """forward_backward ("ppo", clip 0.8 / 1.28) + optim_step through the SDK, twice, gives the adapter
    grooves' `train_step` gives on the same tokens, sampler logprobs and advantages."""
    url, app = server
    config, policy, optimizer = _grooves_side(tiny_model_dir)
    turns = [
        SampledTurn(prompt_token_ids=PROMPT, token_ids=c, logprobs=lp, adapter_version=v)
        for c, lp, v in zip(COMPLETIONS, SAMPLED_LP, (0, 0), strict=True)
    ]
    with client(url) as sc:
        tc = sc.create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=3).result()
        assert _same(
            trained(app, tc.model_id), _mine(policy), 0.0
        )  # created as the trainer creates its policy
        start = _mine(policy)
        for step in (1, 2):
            group = TrajectoryGroup(
                trajectories=[
                    Trajectory(turns=[t.model_copy(update={"adapter_version": step - 1})], reward=r)
                    for t, r in zip(turns, (1.0, 0.0), strict=True)
                ]
            )
            stats, _ = train_step(policy, optimizer, [group], config, run_loss(config))
            # grooves: A = +-0.5, loss = sum / 2; Tinker sums, so its advantages are +-0.25
            data = [
                rl_datum(PROMPT, c, lp, a)
                for c, lp, a in zip(COMPLETIONS, SAMPLED_LP, (0.25, -0.25), strict=True)
            ]
            fb = tc.forward_backward(data, "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
            adam = types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, grad_clip_norm=0.0)
            step_result = tc.optim_step(adam)
            out = fb.result()
            step_result.result()
            assert math.isclose(out.metrics["loss:sum"], stats["loss"], rel_tol=1e-5)  # the same number
            assert stats["grad_norm"] > 0
            # float32 rounding of two forward passes that sum in another order (grooves packs the
            # shared prompt), which Adam's first steps amplify where a gradient is near 0: 1e-6 here
            assert _same(trained(app, tc.model_id), _mine(policy), 1e-5), f"step {step}"
            moved = max(
                float((a - b).abs().max())
                for a, b in zip(_mine(policy).values(), start.values(), strict=True)
            )
            assert moved > 5e-3  # the steps moved the weights by far more than the tolerance


def _same(a: dict, b: dict, atol: float) -> bool:
    return a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=0, atol=atol) for k in a)


def _trainer_logprobs(tc, prompt: list[int], tokens: list[int]) -> list[float]:
    """The training model's logprobs of `tokens` after `prompt` (a forward pass, no gradient kept)."""
    seq = prompt + tokens
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(seq[:-1]),
        loss_fn_inputs={"target_tokens": seq[1:], "weights": [0.0] * (len(seq) - 1)},
    )
    out = tc.forward([datum], "cross_entropy").result()
    return out.loss_fn_outputs[0]["logprobs"].tolist()[len(prompt) - 1 :]


def test_a_sampler_samples_the_weights_it_was_saved_with(server, tiny_model_dir):
    """A sampling client keeps sampling the adapter as it was saved after the model trains on;
    its logprobs are the trainer's recomputation; the base model samples as the base."""
    url, app = server
    params = types.SamplingParams(max_tokens=6, seed=11, temperature=1.0)
    prompt = types.ModelInput.from_ints(PROMPT)
    with client(url) as sc:
        tc = sc.create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=5).result()
        ce = [
            types.Datum(
                model_input=types.ModelInput.from_ints(PROMPT),
                loss_fn_inputs={"target_tokens": PROMPT[1:] + [8], "weights": [1.0] * 5},
            )
        ]
        for _ in range(2):
            tc.forward_backward(ce, "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=0.05))
        sampler = tc.save_weights_and_get_sampling_client().result()
        first = sampler.sample(prompt, 2, params).result()
        for seq in first.sequences:
            assert len(seq.tokens) == len(seq.logprobs) and seq.stop_reason in ("stop", "length")
            mine = _trainer_logprobs(tc, PROMPT, list(seq.tokens))
            assert np.allclose(mine, seq.logprobs, atol=1e-4), (mine, seq.logprobs)  # sampler vs trainer
        before = _trainer_logprobs(tc, PROMPT, list(first.sequences[0].tokens))
        for _ in range(2):  # the model moves on
            tc.forward_backward(ce, "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=0.05))
        after = _trainer_logprobs(tc, PROMPT, list(first.sequences[0].tokens))
        assert np.abs(np.array(after) - np.array(before)).max() > 1e-3  # the live weights did change
        again = sampler.sample(prompt, 2, params).result()
        assert [s.tokens for s in again.sequences] == [s.tokens for s in first.sequences]
        for seq, was in zip(again.sequences, first.sequences, strict=True):
            # the sampler batches by arrival, and a row rounds by its batch: a tolerance, not bits
            assert np.allclose(seq.logprobs, was.logprobs, atol=1e-4), (seq.logprobs, was.logprobs)
        newer = tc.save_weights_and_get_sampling_client().result()
        moved = newer.compute_logprobs(
            types.ModelInput.from_ints(PROMPT + list(first.sequences[0].tokens))
        ).result()
        assert np.allclose(moved[len(PROMPT) :], after, atol=1e-4)
        assert moved[0] is None
        base = sc.create_sampling_client(base_model=str(tiny_model_dir)).result()
        base_lp = base.compute_logprobs(
            types.ModelInput.from_ints(PROMPT + list(first.sequences[0].tokens))
        ).result()
        with torch.no_grad():  # the base weights themselves, loaded on their own
            model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
            ids = torch.tensor([PROMPT + list(first.sequences[0].tokens)])
            logits = model(input_ids=ids).logits[0].log_softmax(-1)
            want = [float(logits[i, ids[0, i + 1]]) for i in range(ids.shape[1] - 1)]
        assert np.allclose(base_lp[1:], want, atol=1e-5)
        assert base.sample(prompt, 1, params).result().sequences[0].tokens


def test_a_sampler_of_unchanged_weights_samples_the_training_model_itself(server, tiny_model_dir):
    """Between an RL loop's save and its next step, a sampler samples the training model's own policy
    (no copy of the adapter is loaded); once the model steps, the saved copy is loaded and samples the
    same tokens with the same logprobs."""
    url, app = server
    samplers = app.state.tinker.samplers
    params = types.SamplingParams(max_tokens=6, seed=7, temperature=1.0)
    prompt = types.ModelInput.from_ints(PROMPT)
    ce = [
        types.Datum(
            model_input=types.ModelInput.from_ints(PROMPT),
            loss_fn_inputs={"target_tokens": PROMPT[1:] + [8], "weights": [1.0] * 5},
        )
    ]
    with client(url) as sc:
        tc = sc.create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=6).result()
        tc.forward_backward(ce, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
        sampler = tc.save_weights_and_get_sampling_client().result()
        loaded = set(samplers._loaded)
        generator = app.state.tinker.models[tc.model_id].policy.generator
        state = generator.get_state()
        first = sampler.sample(prompt, 3, params).result()
        unseeded = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=4)).result()
        assert set(samplers._loaded) == loaded  # sampled on the live adapter: nothing loaded
        assert len(unseeded.sequences) == 2
        assert torch.equal(generator.get_state(), state)  # a saved state's RNG is not the samplers'
        tc.forward_backward(ce, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=0.05)).result()
        again = sampler.sample(prompt, 3, params).result()
        assert len(set(samplers._loaded) - loaded) == 1  # the saved copy, now that the model moved on
        assert [s.tokens for s in again.sequences] == [s.tokens for s in first.sequences]
        for a, b in zip(again.sequences, first.sequences, strict=True):
            assert np.allclose(a.logprobs, b.logprobs, atol=1e-5), (a.logprobs, b.logprobs)


def test_a_restarted_service_resumes_a_model_from_save_state_exactly(tiny_model_dir, tmp_path):
    """save_state, the service stops, a new one starts on the same folder: the model created from
    the state with its optimizer takes the next step exactly as the model that never stopped."""
    data = [rl_datum(PROMPT, c, lp, a) for c, lp, a in zip(COMPLETIONS, SAMPLED_LP, (1.0, -1.0), strict=True)]
    adam = types.AdamParams(learning_rate=0.02)

    def step(tc):
        tc.forward_backward(data, "importance_sampling")
        tc.optim_step(adam).result()

    with tinker_server(tmp_path / "svc", tiny_model_dir) as (url, app), client(url) as sc:
        tc = sc.create_lora_training_client(base_model=str(tiny_model_dir), rank=4, seed=2).result()
        step(tc)
        path = tc.save_state("after-1").result().path
        step(tc)
        uninterrupted = trained(app, tc.model_id)
    with tinker_server(tmp_path / "svc", tiny_model_dir) as (url, app), client(url) as sc:
        listed = tinker.RestClient(base_url=url, api_key=ALICE).list_checkpoints(path.split("/")[2]).result()
        assert [c.tinker_path for c in listed.checkpoints] == [path]
        tc = sc.create_training_client_from_state_with_optimizer(path).result()
        step(tc)
        resumed = trained(app, tc.model_id)
    assert _same(resumed, uninterrupted, 0.0)


def test_two_api_keys_cannot_see_each_others_models(server, tiny_model_dir):
    url, app = server
    with client(url, ALICE) as alice, client(url, BOB) as bob:
        tc = alice.create_lora_training_client(base_model=str(tiny_model_dir), rank=4).result()
        state = tc.save_state("mine").result().path
        sampler_path = tc.save_weights_for_sampler("mine").result().path
        with pytest.raises(tinker.RequestFailedError, match="no saved weights"):
            bob.create_training_client_from_state(state).result()
        with pytest.raises(tinker.NotFoundError, match="no saved weights"):
            bob.create_sampling_client(model_path=sampler_path).result()
        headers = {"X-API-Key": BOB}
        r = httpx.post(f"{url}/api/v1/get_info", json={"model_id": tc.model_id}, headers=headers)
        assert r.status_code == 404 and "no training model" in r.json()["error"]["message"]
        r = httpx.get(f"{url}/api/v1/training_runs/{tc.model_id}/checkpoints", headers=headers)
        assert r.json() == {"checkpoints": []}
        r = httpx.post(
            f"{url}/api/v1/get_info", json={"model_id": tc.model_id}, headers={"X-API-Key": "tml-wrong-key"}
        )
        assert r.status_code == 401 and "X-API-Key" in r.json()["error"]["message"]
        r = httpx.post(f"{url}/api/v1/get_info", json={"model_id": tc.model_id}, headers={"X-API-Key": ALICE})
        assert r.status_code == 200 and r.json()["model_data"]["tokenizer_id"] == str(
            tiny_model_dir.resolve()
        )


def test_another_keys_request_ids_and_samplers_are_unknown_ids(server, tiny_model_dir):
    """alice's request id and sampling session answer bob as ids never given out do (404), and alice
    reads them."""
    url, _ = server
    alice, bob = {"X-API-Key": ALICE}, {"X-API-Key": BOB}
    api = f"{url}/api/v1"
    session = httpx.post(f"{api}/create_session", json={}, headers=alice).json()["session_id"]
    body = {"session_id": session, "base_model": str(tiny_model_dir)}
    sampler = httpx.post(f"{api}/create_sampling_session", json=body, headers=alice).json()[
        "sampling_session_id"
    ]
    asked = {"sampling_session_id": sampler, "prompt": types.ModelInput.from_ints(PROMPT).model_dump()}
    asked["sampling_params"] = {"max_tokens": 2}
    request_id = httpx.post(f"{api}/asample", json=asked, headers=alice).json()["request_id"]

    def retrieve(request_id: str, key: dict) -> httpx.Response:
        return httpx.post(f"{api}/retrieve_future", json={"request_id": request_id}, headers=key, timeout=60)

    def describe(sampler: str, key: dict) -> httpx.Response:
        return httpx.get(f"{api}/samplers/{sampler}", headers=key)

    def sample(sampler: str, key: dict) -> httpx.Response:
        return httpx.post(f"{api}/asample", json={**asked, "sampling_session_id": sampler}, headers=key)

    for ask, real in ((retrieve, request_id), (describe, sampler), (sample, sampler)):
        unknown = "0" * len(real)
        theirs, nobodys = ask(real, bob), ask(unknown, bob)
        assert theirs.status_code == nobodys.status_code == 404, ask.__name__
        assert theirs.text.replace(real, "<id>") == nobodys.text.replace(unknown, "<id>"), ask.__name__
        assert ask(real, alice).status_code == 200, ask.__name__
    httpx.post(f"{api}/sessions/{session}/finish", headers=alice)


def _proto(model_id: str, seq_id: int, data, loss_fn="cross_entropy", config=None) -> bytes:
    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=config),
        model_id=model_id,
        seq_id=seq_id,
    )
    return forward_backward_request_to_proto(req).SerializeToString()


def _ce(tokens, weights=None, targets=None):
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens),
        loss_fn_inputs={
            "target_tokens": targets if targets is not None else tokens[1:] + [3],
            "weights": weights if weights is not None else [1.0] * len(tokens),
        },
    )


REFUSED = [
    (
        "shapes",
        lambda tc: tc.forward_backward([_ce([5, 6, 7], weights=[1.0, 1.0])], "cross_entropy"),
        "data[0].loss_fn_inputs.weights: shape [2], but model_input has 3 tokens",
    ),
    (
        "target length",
        lambda tc: tc.forward_backward([_ce([5, 6, 7], targets=[6, 7])], "cross_entropy"),
        "data[0].loss_fn_inputs.target_tokens: shape [2], but model_input has 3 tokens",
    ),
    (
        "missing input",
        lambda tc: tc.forward_backward(
            [
                types.Datum(
                    model_input=types.ModelInput.from_ints([5, 6]), loss_fn_inputs={"target_tokens": [6, 7]}
                )
            ],
            "cross_entropy",
        ),
        "data[0].loss_fn_inputs: 'cross_entropy' needs weights",
    ),
    (
        "extra input",
        lambda tc: tc.forward_backward(
            [
                types.Datum(
                    model_input=types.ModelInput.from_ints([5, 6]),
                    loss_fn_inputs={"target_tokens": [6, 7], "weights": [1.0, 1.0], "advantages": [0.0, 1.0]},
                )
            ],
            "cross_entropy",
        ),
        "data[0].loss_fn_inputs: advantages not read by 'cross_entropy'",
    ),
    (
        "nan",
        lambda tc: tc.forward_backward([rl_datum(PROMPT, [61], [-1.0], float("nan"))], "importance_sampling"),
        "data[0].loss_fn_inputs.advantages[4]: nan is not a finite number",
    ),
    (
        "logprob",
        lambda tc: tc.forward_backward([rl_datum(PROMPT, [61], [0.5], 1.0)], "importance_sampling"),
        "data[0].loss_fn_inputs.logprobs[4]: 0.5 is not a log-probability",
    ),
    (
        "vocab",
        lambda tc: tc.forward_backward([_ce([5, 6, 99999])], "cross_entropy"),
        "data[0].model_input[2]: 99999 is not a token id of this model",
    ),
    (
        "target",
        lambda tc: tc.forward_backward([_ce([5, 6], targets=[6, -1])], "cross_entropy"),
        "data[0].loss_fn_inputs.target_tokens[1]: -1 is not a token id",
    ),
    (
        "config",
        lambda tc: tc.forward_backward([rl_datum(PROMPT, [61], [-1.0], 1.0)], "ppo", {"beta": 0.1}),
        "loss_fn_config.beta: not an option of 'ppo'",
    ),
    (
        "loss",
        lambda tc: tc.forward_backward([rl_datum(PROMPT, [61], [-1.0], 1.0)], "gspo"),
        "loss_fn 'gspo' is not supported here",
    ),
    (
        "too long",
        lambda tc: tc.forward_backward([_ce([5] * 9000)], "cross_entropy"),
        "data[0].model_input: 9000 tokens, more than",
    ),
    (
        "learning rate",
        lambda tc: tc.optim_step(types.AdamParams(learning_rate=-1.0)),
        "adam_params.learning_rate: Input should be greater than or equal to 0",
    ),
    (
        "beta1",
        lambda tc: tc.optim_step(types.AdamParams(beta1=1.0)),
        "adam_params.beta1: Input should be less than 1",
    ),
    (
        "eps",
        lambda tc: tc.optim_step(types.AdamParams(eps=0.0)),
        "adam_params.eps: Input should be greater than 0",
    ),
    (
        "optimizer",
        lambda tc: tc.optim_step(types.DimuonParams(learning_rate=0.01)),
        "optimizer_params: only Adam (adam_params) is supported here",
    ),
]
"""Each kind of training request the service refuses, sent with the SDK, and the message it is refused with."""


def test_a_refused_training_request_takes_its_turn_and_the_client_trains_on(server, tiny_model_dir):
    """A bad forward_backward or optim_step fails with a message naming the field and changes nothing,
    but it takes its seq_id: the same client's next requests (one already sent behind it) run, and the
    training is saved. A refusal that left its seq_id unused would hold every later request for ever."""
    url, app = server
    adam = types.AdamParams(learning_rate=0.01)
    with client(url) as sc:
        tc = sc.create_lora_training_client(base_model=str(tiny_model_dir), rank=4).result(timeout=60)
        for name, send, message in REFUSED:
            before = trained(app, tc.model_id)
            refused = send(tc)
            queued = tc.forward_backward(
                [_ce([5, 6, 7])], "cross_entropy"
            )  # sent before the refusal is known
            with pytest.raises(tinker.RequestFailedError, match=re.escape(message)):
                refused.result(timeout=60)
            assert _same(trained(app, tc.model_id), before, 0.0), name  # nothing applied
            assert queued.result(timeout=60).metrics["loss:sum"] > 0, name
            tc.optim_step(adam).result(timeout=60)
            assert not _same(trained(app, tc.model_id), before, 0.0), name  # the client trains on
        saved = tc.save_state("after-refusals").result(timeout=60)
        assert saved.path == f"tinker://{tc.model_id}/weights/after-refusals"


def test_malformed_protobuf_unknown_models_and_reused_seq_ids_are_refused(server, tiny_model_dir):
    url, app = server
    headers = {"X-API-Key": ALICE, "Content-Type": "application/x-protobuf"}
    fb = f"{url}/api/v1/forward_backward"
    with client(url) as sc:
        tc = sc.create_lora_training_client(base_model=str(tiny_model_dir), rank=4).result()
        r = httpx.post(fb, content=b"\xff\xff\xff", headers=headers)
        assert (
            r.status_code == 400
            and "not a ForwardBackwardRequest protobuf message" in r.json()["error"]["message"]
        )
        r = httpx.post(fb, content=_proto("nope:train:0", 1, [_ce([5, 6])]), headers=headers)
        assert r.status_code == 404 and "no training model 'nope:train:0'" in r.json()["error"]["message"]
        first = httpx.post(fb, content=_proto(tc.model_id, 1, [_ce([5, 6])]), headers=headers)
        assert first.status_code == 200 and first.json()["request_id"]
        again = httpx.post(
            fb, content=_proto(tc.model_id, 1, [_ce([5, 6])]), headers=headers
        )  # its answer lost
        assert again.json()["request_id"] == first.json()["request_id"]  # the same request: its future again
        r = httpx.post(fb, content=_proto(tc.model_id, 1, [_ce([5, 7])]), headers=headers)
        assert r.status_code == 400
        assert (
            "seq_id 1 was already used by this model; its next request is seq_id 2"
            in r.json()["error"]["message"]
        )
        r = httpx.post(
            f"{url}/api/v1/retrieve_future", json={"request_id": "unknown"}, headers={"X-API-Key": ALICE}
        )
        assert r.status_code == 404


def test_requests_run_in_seq_id_order_whatever_order_they_arrive_in(server, tiny_model_dir, monkeypatch):
    """seq 2 (an optimizer step) sent before seq 1 (its gradient) waits for it: the step applies the gradient."""
    url, app = server
    headers = {"X-API-Key": ALICE}
    with client(url) as sc:
        tc = sc.create_lora_training_client(base_model=str(tiny_model_dir), rank=4).result()
        before = trained(app, tc.model_id)
        # a poll of a request still waiting answers try_again after the futures' wait (20 s by default)
        monkeypatch.setattr(app.state.tinker.futures, "wait", 1.0)
        r2 = httpx.post(
            f"{url}/api/v1/optim_step",
            json={"model_id": tc.model_id, "seq_id": 2, "adam_params": {"learning_rate": 0.01}},
            headers=headers,
        )
        pending = httpx.post(
            f"{url}/api/v1/retrieve_future",
            json={"request_id": r2.json()["request_id"]},
            headers=headers,
            timeout=60,
        )
        assert pending.json()["type"] == "try_again"  # waiting for seq 1
        body = _proto(tc.model_id, 1, [_ce([5, 6, 7])])
        httpx.post(
            f"{url}/api/v1/forward_backward",
            content=body,
            headers={**headers, "Content-Type": "application/x-protobuf"},
        )
        done = httpx.post(
            f"{url}/api/v1/retrieve_future",
            json={"request_id": r2.json()["request_id"]},
            headers=headers,
            timeout=60,
        )
        assert done.json()["metrics"]["grad_norm:mean"] > 0  # seq 1's gradient was there
        assert not _same(trained(app, tc.model_id), before, 0.0)
