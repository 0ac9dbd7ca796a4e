"""A training run with `model.backend = "vllm"` on the real engine (vLLM's CPU build): every step's
adapter reaches the sampler, and the trainer's on-policy checks see it."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from grooves.config import parse_config  # noqa: E402
from grooves.training.loop import train  # noqa: E402
from tiny_models import build_tiny_model_dir  # noqa: E402

pytestmark = pytest.mark.vllm


def test_each_steps_adapter_samples_the_next_step_and_the_mismatch_stays_at_float32s(tmp_path):
    model_dir = build_tiny_model_dir(tmp_path / "model", hidden_size=128, init_std=0.2)
    config = parse_config(
        {
            "name": "toy",
            "output_dir": str(tmp_path / "run"),
            "seed": 1,
            "steps": 3,
            "task": "toy_tokens",
            "task_options": {"vocab_size": 487, "num_scenarios": 16},
            "model": {"base_model": str(model_dir), "backend": "vllm"},
            "vllm": {"kv_cache_gib": 0.25},
            "rollout": {"group_size": 8, "groups_per_step": 4, "max_tokens": 4},
            # a large step: a sampler that kept the previous adapter would be far from the trainer
            "optim": {"lr": 5e-2},
            "lora": {"rank": 4, "alpha": 8},
            "validation": {"every": 3, "scenarios": 8},
            "logging": {"progress": False, "report": False},
        }
    )
    run_dir = train(config)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("adapter_version") is not None]
    assert [r["adapter_version"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert 0.0 < r["mismatch_abs_max"] < 1e-4, r  # float32 on both sides
        assert 0.0 < r["mismatch_k3_mean"] < 1e-8, r
        assert r["staleness_max"] == 0.0, r  # every turn sampled by the live adapter
    for step in (1, 2, 3):
        groups = [
            json.loads(line)
            for line in (run_dir / "samples" / f"step_{step:06d}.jsonl").read_text().splitlines()
        ]
        versions = {t["adapter_version"] for g in groups for traj in g["trajectories"] for t in traj["turns"]}
        assert versions == {step - 1}, (step, versions)
    assert rows[-1].get("val/success_rate") is not None
