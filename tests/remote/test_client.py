"""The client side of the training service: what a step sends, and that it needs no torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup
from grooves.remote.model import run_config, service_sections
from grooves.remote.wire import TrainRequest, to_groups, to_records


def _traj(reward: float, tokens: list[int], version: int | None = 3) -> Trajectory:
    return Trajectory(
        messages=[{"role": "user", "content": "What is the capital of Peru?"}],
        turns=[
            SampledTurn(
                prompt_token_ids=[1, 2, 3],
                token_ids=tokens,
                logprobs=[-0.25] * len(tokens),
                text="Lima",
                adapter_version=version,
                temperature=0.7,
            )
        ],
        reward=reward,
        rewards={"correct": reward},
        metrics={"success": reward},
        metadata={"scenario": {"country": "Peru", "secret": "db row"}},
    )


def test_a_step_sends_token_records_and_numbers_only():
    group = TrajectoryGroup(
        scenario={"country": "Peru", "capital": "Lima"},
        trajectories=[_traj(1.0, [7, 8]), _traj(0.0, [9]), Trajectory(error="TimeoutError: judge")],
    )
    records = to_records([group])
    text = json.dumps(records)
    for private in ("Peru", "Lima", "capital", "secret", "messages", "metadata"):
        assert private not in text  # messages, scenario and metadata stay on the user's machine
    assert records[0]["trajectories"][2] == {"error": "TimeoutError: judge"}
    (back,) = to_groups(TrainRequest.model_validate({"step": 1, "groups": records}).groups)
    for sent, got in zip(group.trajectories, back.trajectories, strict=True):
        assert (got.reward, got.rewards, got.metrics, got.error) == (
            sent.reward,
            sent.rewards,
            sent.metrics,
            sent.error,
        )
        for a, b in zip(sent.turns, got.turns, strict=True):
            fields = ("prompt_token_ids", "token_ids", "logprobs", "adapter_version", "temperature")
            assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]


def test_a_turn_without_an_adapter_version_is_refused_before_sending():
    group = TrajectoryGroup(trajectories=[_traj(1.0, [7]), _traj(0.0, [8], version=None)])
    with pytest.raises(
        ValueError, match=r"groups\[0\]\.trajectories\[1\]\.turns\[0\] has no adapter_version"
    ):
        to_records([group])


def test_only_the_service_sections_of_a_run_file_are_sent(tmp_path):
    run_file = tmp_path / "run.toml"
    run_file.write_text('task = "capitals"\nsteps = 5\n[lora]\nrank = 2\n[validation]\nevery = 2\n')
    assert service_sections(run_config(run_file), set_only=True) == {"lora": {"rank": 2}}
    full = service_sections(run_config(run_file))
    assert sorted(full) == ["algorithm", "checkpoint", "logging", "lora", "model", "optim", "rollout", "seed"]


def test_the_client_imports_no_torch():
    code = "import sys, grooves.remote; print('torch' in sys.modules or 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
