"""Rollouts on Ray actors through a real HTTP policy server give the in-process runner's trajectories.

Runs a local Ray (2 CPUs) on this machine. Skipped where Ray is not installed
(`pip install -e '.[ray]'` installs it).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

ray = pytest.importorskip("ray")

from grooves.config import parse_config  # noqa: E402
from grooves.core.trajectory import Trajectory  # noqa: E402
from grooves.policy.transformers import TransformersPolicy  # noqa: E402
from grooves.rollouts.gather import gather  # noqa: E402
from grooves.rollouts.handle import ModelHandle  # noqa: E402
from grooves.scale import LocalRollouts, start_rollouts  # noqa: E402
from grooves.scale.policy_server import PolicyServer  # noqa: E402
from grooves.scale.ray_rollouts import RayRolloutRunner  # noqa: E402
from grooves.serve.app import inprocess_client  # noqa: E402
from grooves.tasks.toy import ToyTokensTask  # noqa: E402
from grooves.training.loop import train  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TransformersPolicy(str(tiny_model_dir), seed=0, served_name="tiny")


def _gather(rollout, policy, scenarios, group_size):
    async def go():
        client = inprocess_client(policy)
        handle = ModelHandle(client, "tiny", temperature=1.0, max_tokens=6, seed=11)
        try:
            return await gather(rollout, handle, scenarios, group_size, progress=False, seed_key=(3,))
        finally:
            await client.close()

    return asyncio.run(go())


def _fingerprint(groups):
    return [[(t.turns[0].token_ids, t.reward, t.error) for t in g.trajectories] for g in groups]


def test_ray_rollouts_match_the_in_process_runner(local_ray, policy):
    task = ToyTokensTask(vocab_size=487, num_scenarios=6)
    scenarios = task.scenarios("train")[:2]
    local = _gather(task.rollout, policy, scenarios, 4)
    server = PolicyServer(policy, api_key="run-key")  # the trainer draws one per run; only its actors have it
    runner = RayRolloutRunner(task.rollout, server.url, num_workers=2, api_key="run-key")
    try:
        remote = _gather(runner.rollout, policy, scenarios, 4)
        keyless = httpx.get(server.url + "/models", timeout=10)
    finally:
        runner.close()
        server.close()
    assert keyless.status_code == 401
    assert [len(g) for g in remote] == [4, 4]
    assert _fingerprint(remote) == _fingerprint(local)
    for lg, rg in zip(local, remote, strict=True):
        for lt, rt in zip(lg.trajectories, rg.trajectories, strict=True):
            assert rt.turns[0].prompt_token_ids == lt.turns[0].prompt_token_ids
            assert rt.turns[0].logprobs == pytest.approx(lt.turns[0].logprobs, abs=1e-4)
    # the rollouts really sampled different tokens (a seeded group is not 4 copies of one answer)
    assert len({tuple(t.turns[0].token_ids) for t in local[0].trajectories}) > 1


class FlakyTask:
    """Raises on the second scenario: a failure in an actor is recorded as data, as it is locally."""

    async def rollout(self, model, scenario):
        if scenario["n"] == 1:
            raise ValueError("tool backend down")
        traj = Trajectory(messages=[{"role": "user", "content": "hi"}])
        traj.add_choice(await model.complete(traj.messages))
        traj.reward = 1.0
        return traj


def test_a_failing_rollout_on_ray_is_recorded_not_raised(local_ray, policy):
    server = PolicyServer(policy)
    runner = RayRolloutRunner(FlakyTask().rollout, server.url, num_workers=1)
    try:
        groups = _gather(runner.rollout, policy, [{"n": 0}, {"n": 1}], 2)
    finally:
        runner.close()
        server.close()
    assert [t.error for t in groups[0].trajectories] == [None, None]
    assert [t.error for t in groups[1].trajectories] == ["ValueError: tool backend down"] * 2
    assert groups[1].trajectories[0].metadata == {"scenario": {"n": 1}}


def test_local_runner_is_the_task_function_itself():
    task = ToyTokensTask()
    config = parse_config({})
    runner = start_rollouts(config.rollout.runner, config.ray, task.rollout, policy=None)
    assert isinstance(runner, LocalRollouts) and runner.rollout == task.rollout


def _run_config(model_dir, out, runner):
    return parse_config(
        {
            "name": "toy",
            "output_dir": str(out),
            "seed": 1,
            "steps": 2,
            "task": "toy_tokens",
            "task_options": {"vocab_size": 487, "num_scenarios": 8},
            "model": {"base_model": str(model_dir)},
            "rollout": {
                "group_size": 4,
                "groups_per_step": 2,
                "max_tokens": 4,
                "runner": runner,
            },
            "ray": {"workers": 2},
            "optim": {"lr": 5e-2},
            "lora": {"rank": 4, "alpha": 8},
            "validation": {"every": 0, "scenarios": 2},
            "logging": {"progress": False, "report": False},
        }
    )


def test_training_with_the_ray_runner_equals_the_local_run(local_ray, peaked_model_dir, tmp_path):
    """Same seeds, same steps: the metrics of a run whose rollouts ran on Ray equal a local run's."""
    rows = {}
    for runner in ("local", "ray"):
        run_dir = train(_run_config(peaked_model_dir, tmp_path / runner, runner))
        rows[runner] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = (
        "step",
        "reward_mean",
        "sampled_tokens",
        "rollouts",
        "failed_rollouts",
        "adapter_version",
        "val/reward_mean",
    )
    pick = {name: [{k: r.get(k) for k in keys} for r in rs] for name, rs in rows.items()}
    assert pick["ray"] == pick["local"]
    assert [r["step"] for r in rows["ray"]] == [0, 1, 2]  # validation at 0, two training steps
    for ray_row, local_row in zip(rows["ray"][1:], rows["local"][1:], strict=True):
        assert ray_row["rollouts"] == 8 and ray_row["failed_rollouts"] == 0
        assert ray_row["loss"] == pytest.approx(local_row["loss"], abs=1e-6)
        assert ray_row["grad_norm"] == pytest.approx(local_row["grad_norm"], rel=1e-4)
