"""`task = "verifiers:<taskset>"` end to end: verifiers' own environment server (in .venv-verifiers),
its harness sampling through grooves' token route, the traces trained on. Marked `verifiers`
(make test-verifiers); needs the virtualenv with examples/verifiers installed (make setup-verifiers)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from grooves.config import parse_config
from grooves.core.tokenize import trajectory_to_sequences
from grooves.policy.transformers import TransformersPolicy
from grooves.rollouts.handle import ModelHandle
from grooves.serve.app import create_app, inprocess_client
from grooves.tasks import TaskLoadError, load_task
from grooves.training.loop import train

pytest.importorskip("zmq", reason="the verifiers extra (pyzmq) is not installed")
VERIFIERS_PYTHON = Path(__file__).resolve().parents[2] / ".venv-verifiers" / "bin" / "python"
pytestmark = [
    pytest.mark.verifiers,
    pytest.mark.skipif(not VERIFIERS_PYTHON.exists(), reason="needs .venv-verifiers: make setup-verifiers"),
]
OPTIONS = {"python": str(VERIFIERS_PYTHON), "validation_taskset": '{"split": "test"}'}


def test_an_unknown_environment_is_one_line_before_anything_runs():
    with pytest.raises(TaskLoadError) as caught:
        load_task("verifiers:no_such_env", {"python": str(VERIFIERS_PYTHON)})
    message = str(caught.value)
    assert (
        "\n" not in message
        and "'no_such_env' is not installed" in message
        and str(VERIFIERS_PYTHON) in message
    )


def test_rollouts_carry_the_ids_and_logprobs_the_model_sampled(tiny_model_dir):
    policy = TransformersPolicy(str(tiny_model_dir), served_name="tiny")
    task = load_task("verifiers:capital_quiz", OPTIONS)
    try:
        assert [len(task.scenarios(s)) for s in ("train", "validation")] == [40, 20]
        handle = ModelHandle(inprocess_client(create_app(policy)), "tiny", temperature=1.0, max_tokens=6)

        async def two():
            return await asyncio.gather(*[task.rollout(handle, s) for s in task.scenarios("validation")[:2]])

        for traj in asyncio.run(two()):
            (turn,) = traj.turns
            question = traj.messages[0]["content"]
            assert question.startswith("What is the capital of ")
            # verifiers rendered the prompt itself; it is the same ids grooves renders
            assert turn.prompt_token_ids == policy.prompts.render(
                [{"role": "user", "content": question}], None
            )
            assert len(turn.token_ids) == len(turn.logprobs) == 6
            ids = torch.tensor([turn.prompt_token_ids + turn.token_ids])  # [1, P+T]
            with torch.no_grad():
                logits = policy.model(input_ids=ids).logits[0, len(turn.prompt_token_ids) - 1 : -1].float()
            expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(turn.token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(turn.logprobs), expected, atol=1e-4)  # the sampler's, exactly
            assert traj.reward in (0.0, 1.0) and traj.rewards.keys() == {"correct_and_short"}
            assert sum(trajectory_to_sequences(traj, 1.0)[0].sampled_mask) == 6
    finally:
        task.close()


def test_a_run_trains_on_the_environment(tiny_model_dir, tmp_path):
    config = parse_config(
        {
            "name": "vf",
            "output_dir": str(tmp_path / "run"),
            "seed": 0,
            "steps": 1,
            "task": "verifiers:capital_chain",
            "task_options": OPTIONS | {"validation_taskset": '{"split": "test", "episodes": 2}'},
            "model": {"base_model": str(tiny_model_dir)},
            "rollout": {"group_size": 2, "groups_per_step": 2, "max_tokens": 4},
            "lora": {"rank": 2, "alpha": 4},
            "validation": {"every": 0, "scenarios": 2, "at_start": False},
            "logging": {"progress": False, "report": False},
        }
    )
    rows = [json.loads(line) for line in (train(config) / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "loss" in r)
    assert step["rollouts"] == 4 and step["failed_rollouts"] == 0
    assert step["sampled_tokens"] == 4 * 3 * 4  # 4 episodes x 3 answers x 4 tokens: every turn trained
    assert any("val/success_rate" in r for r in rows)
