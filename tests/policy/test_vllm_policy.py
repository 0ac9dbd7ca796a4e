"""The vLLM backend without its engine: adapter publishing, request mapping, the checks before it starts.

These run everywhere (no vLLM needed). The real engine's tests are in test_vllm_engine.py and
test_vllm_runs.py (marked `vllm`: `make test-vllm` runs them on vLLM's CPU build).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from grooves.config import ConfigError, LoraConfig, check_against_model, parse_config
from grooves.config.check import VLLM_MISSING, vllm_problems
from grooves.policy.sampling import SamplingParams
from grooves.policy.transformers import TransformersPolicy
from grooves.policy.vllm import (
    AdapterPublisher,
    completion_from_vllm,
    lora_rank_cap,
    vllm_sampling_kwargs,
)
from grooves.training.session import build_policy


@pytest.fixture(scope="module")
def trainable(tiny_model_dir):
    return TransformersPolicy(str(tiny_model_dir), lora=LoraConfig(rank=4, alpha=8), seed=0)


def test_lora_rank_cap_is_the_smallest_rank_vllm_accepts():
    assert [lora_rank_cap(r) for r in (1, 4, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(ValueError, match="lora.rank = 600"):
        lora_rank_cap(600)


def _lora_tensors(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_each_version_is_saved_with_a_new_id_and_old_folders_are_pruned(trainable, tmp_path):
    publisher = AdapterPublisher(tmp_path / "adapters", "tiny", keep=2)
    refs = []
    for version in range(4):
        with torch.no_grad():  # a stand-in for an optimizer step: new adapter weights per version
            for name, p in trainable.model.named_parameters():
                if "lora_B" in name:
                    p.fill_(0.01 * (version + 1))
        refs.append(publisher.publish(trainable.model, version))
    assert [r.lora_int_id for r in refs] == [1, 2, 3, 4]
    assert [r.name for r in refs] == ["tiny@v0", "tiny@v1", "tiny@v2", "tiny@v3"]
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["v2", "v3"]
    assert publisher.current == refs[-1]
    config = json.loads((tmp_path / "adapters" / "v3" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8
    saved = load_file(str(tmp_path / "adapters" / "v3" / "adapter_model.safetensors"))
    lora_b = [t for k, t in saved.items() if "lora_B" in k]
    assert lora_b and all(torch.allclose(t, torch.full_like(t, 0.04)) for t in lora_b)
    assert len(saved) == len(_lora_tensors(trainable.model))  # only the adapter, not the base weights


def test_republishing_an_earlier_step_never_reuses_an_id(trainable, tmp_path):
    publisher = AdapterPublisher(tmp_path, "tiny")
    first = [publisher.publish(trainable.model, v).lora_int_id for v in (0, 1, 2)]
    resumed = publisher.publish(trainable.model, 1)  # a resumed run sets its checkpoint's step
    assert first == [1, 2, 3] and resumed.lora_int_id == 4 and resumed.version == 1


def test_sampling_params_map_to_vllm_arguments():
    kwargs = vllm_sampling_kwargs(
        SamplingParams(n=8, max_tokens=32, temperature=0.7, top_p=0.9, stop=["\n\n"], seed=5), {2, 0}
    )
    assert kwargs == {
        "n": 8,
        "max_tokens": 32,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 0,
        "seed": 5,
        "stop": ["\n\n"],
        "stop_token_ids": [0, 2],
        "logprobs": 0,
        "skip_special_tokens": True,
    }
    assert vllm_sampling_kwargs(SamplingParams(), {2})["stop"] is None
    shaped = vllm_sampling_kwargs(
        SamplingParams(logit_bias={7: -100.0}, frequency_penalty=0.5, presence_penalty=-0.25, top_logprobs=3),
        {2},
    )
    assert (
        shaped["logit_bias"],
        shaped["frequency_penalty"],
        shaped["presence_penalty"],
        shaped["logprobs"],
    ) == ({7: -100.0}, 0.5, -0.25, 3)
    with pytest.raises(ValueError, match="no grammar text for vLLM's structured outputs"):
        vllm_sampling_kwargs(SamplingParams(constraint=lambda: None), {2})
    grammar = SimpleNamespace(lark='start: %json {"type": "object"}')
    constrained = vllm_sampling_kwargs(SamplingParams(constraint=grammar), {2})
    assert constrained["structured_outputs"] == {"grammar": 'start: %json {"type": "object"}'}


def test_vllm_top_logprobs_are_read_by_rank():
    ranked = {
        4: SimpleNamespace(logprob=-3.0, rank=5),
        9: SimpleNamespace(logprob=-0.2, rank=1),
        1: SimpleNamespace(logprob=-1.9, rank=2),
    }
    output = SimpleNamespace(token_ids=[4], text="x", finish_reason="stop", logprobs=[ranked])
    c = completion_from_vllm(output, top_k=2)
    assert c.logprobs == [-3.0] and c.top_logprobs == [[(9, -0.2), (1, -1.9)]]
    assert completion_from_vllm(output).top_logprobs is None


def _logprob(value):
    return SimpleNamespace(logprob=value)


def test_a_vllm_completion_becomes_ids_logprobs_text():
    # the shape vLLM returns: per position, a dict from token id to Logprob (the sampled one included)
    output = SimpleNamespace(
        token_ids=[17, 4, 2],
        text="Paris",
        finish_reason="stop",
        logprobs=[{17: _logprob(-0.5)}, {4: _logprob(-1.25), 9: _logprob(-0.1)}, {2: _logprob(-0.01)}],
    )
    c = completion_from_vllm(output)
    assert (c.token_ids, c.logprobs, c.text, c.finish_reason) == (
        [17, 4, 2],
        [-0.5, -1.25, -0.01],
        "Paris",
        "stop",
    )
    truncated = SimpleNamespace(
        token_ids=[5], text="x", finish_reason="length", logprobs=[{5: _logprob(-2.0)}]
    )
    assert completion_from_vllm(truncated).finish_reason == "length"
    with pytest.raises(RuntimeError, match="logprobs=0"):
        completion_from_vllm(SimpleNamespace(token_ids=[5], text="x", finish_reason="stop", logprobs=None))


def test_importing_grooves_and_the_trainer_does_not_import_vllm_or_ray():
    code = "import grooves, grooves.training.loop, grooves.serve.app, sys; print('vllm' in sys.modules, 'ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_vllm_backend_without_vllm_fails_at_start_with_one_line(tiny_model_dir):
    config = parse_config({"model": {"base_model": str(tiny_model_dir), "backend": "vllm"}})
    with pytest.raises(ConfigError) as caught:
        check_against_model(config)
    assert str(caught.value) == VLLM_MISSING
    assert "make setup-vllm" in VLLM_MISSING and "\n" not in VLLM_MISSING
    with pytest.raises(ImportError, match=r"vLLM is not installed in this Python; build the vLLM-CPU"):
        build_policy(config)


def test_a_lora_rank_above_vllms_cap_is_refused_before_anything_loads(tiny_model_dir):
    problems = vllm_problems(dtype="float32", lora_rank=600)
    assert (
        "lora.rank = 600 is above vLLM's largest max_lora_rank (512); lower it or use model.backend = 'transformers'"
        in problems
    )
    config = parse_config(
        {
            "model": {"base_model": str(tiny_model_dir), "backend": "vllm"},
            "lora": {"rank": 600, "alpha": 1200},
        }
    )
    with pytest.raises(ConfigError, match=r"lora.rank = 600 is above vLLM's largest max_lora_rank \(512\)"):
        check_against_model(config)


def test_an_adapter_above_the_engines_rank_cap_is_refused_by_name(tmp_path):
    from grooves.policy.vllm import VllmAdapters

    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "adapter_config.json").write_text(json.dumps({"r": 16, "lora_alpha": 32}))
    adapters = VllmAdapters(None, None, threading.RLock(), lambda: None, max_rank=8)
    with pytest.raises(ValueError, match="LoRA rank 16 is above the engine's max_lora_rank 8"):
        adapters.load(tmp_path / "big", "big")
    assert adapters.loaded() == [] and adapters.ref(None) is None
    with pytest.raises(RuntimeError, match="only samples"):
        adapters.bump()


def test_a_streaming_request_gets_every_token_and_its_completion_once_the_batch_is_done():
    from grooves.policy.sampling import Completion
    from grooves.policy.vllm import replay_tokens

    a = Completion(token_ids=[5, 6, 7], logprobs=[-0.1, -0.2, -0.3], text="abc", finish_reason="stop")
    b = Completion(token_ids=[9], logprobs=[-1.5], text="x", finish_reason="length")
    calls = []
    replay_tokens([a, b], calls.append)
    assert [[(e.index, e.token, e.logprob, e.completion) for e in step] for step in calls] == [
        [(0, 5, -0.1, None), (1, 9, -1.5, b)],
        [(0, 6, -0.2, None)],
        [(0, 7, -0.3, a)],
    ]
