"""verifiers' streamed traces become grooves trajectories with exact ids and masks; bad traces are refused."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys

import pytest

from grooves.config import LoraConfig
from grooves.core.tokenize import trajectory_to_sequences
from grooves.core.trajectory import TrajectoryGroup
from grooves.policy.transformers import TransformersPolicy
from grooves.rollouts.handle import ModelHandle
from grooves.serve.app import create_app, inprocess_client
from grooves.tasks import TaskLoadError, load_task, verifiers_server
from grooves.tasks.verifiers import VerifiersError, VerifiersTask, _object
from grooves.tasks.verifiers_traces import TraceAssembly, TraceError, reward_of, sampled_turns, trajectory_of
from grooves.training.pipeline import VersionPins, staleness_stats

SYSTEM, USER1, USER2 = [1, 10, 11, 2], [1, 20, 21, 22, 2], [1, 30, 2]
SCAFFOLD = [1, 40]  # the generation prompt ("<|im_start|>assistant")
ANSWER1, ANSWER2 = [50, 51, 2], [60, 2]


def node(parent, role, ids, sampled_from=None, logprobs=(), content=""):
    mask = [False] * len(ids) if sampled_from is None else [i >= sampled_from for i in range(len(ids))]
    return {
        "parent": parent,
        "message": {"role": role, "content": content},
        "sampled": sampled_from is not None,
        "token_ids": ids,
        "mask": mask,
        "logprobs": list(logprobs),
    }


def two_turn_deltas():
    """A system prompt, a question, an answer, a second question, a second answer: as the server streams them."""
    first = [
        node(None, "system", SYSTEM),
        node(0, "user", USER1),
        node(1, "assistant", SCAFFOLD + ANSWER1, 2, [-0.5, -0.25, -0.125], "Paris"),
    ]
    second = [node(2, "user", USER2), node(3, "assistant", SCAFFOLD + ANSWER2, 2, [-1.0, -0.75], "Rome")]
    return [
        {"trace": "t1", "open": {"id": "t1", "version": 1}, "nodes": first, "calls": [{"node": 2}]},
        {"trace": "gone", "open": {"id": "gone"}, "nodes": [node(None, "user", [9])]},
        {"trace": "gone", "discard": True},
        {"trace": "t1", "nodes": second, "calls": [{"node": 4, "finish_reason": "stop"}]},
        {
            "trace": "t1",
            "set": {
                "rewards": {"right": {"score": 1.0, "weight": 0.5}, "short": {"score": 0.5, "weight": 1.0}}
            },
        },
    ]


def assembled():
    assembly = TraceAssembly()
    for delta in two_turn_deltas():
        assembly.apply(delta)
    return assembly.finish([{"id": "t1", "nodes": 5, "calls": 2}])


def test_each_sampled_turn_is_its_exact_prompt_and_completion():
    (trace,) = assembled()
    first, second = sampled_turns(trace, temperature=0.7)
    assert first.prompt_token_ids == SYSTEM + USER1 + SCAFFOLD and first.token_ids == ANSWER1
    assert first.logprobs == [-0.5, -0.25, -0.125] and first.temperature == 0.7
    assert second.prompt_token_ids == SYSTEM + USER1 + SCAFFOLD + ANSWER1 + USER2 + SCAFFOLD
    assert second.token_ids == ANSWER2 and second.text == "Rome"


def test_a_trajectory_trains_only_the_sampled_tokens_in_one_sequence():
    (trace,) = assembled()
    traj = trajectory_of(trace, temperature=1.0, success_threshold=1.0)
    assert traj.reward == 1.0 and traj.rewards == {"right": 1.0, "short": 0.5}  # 1.0 x 0.5 + 0.5 x 1.0
    assert traj.metrics == {"success": 1.0, "turns": 2.0}
    assert [m["role"] for m in traj.messages] == ["system", "user", "assistant", "user", "assistant"]
    (seq,) = trajectory_to_sequences(traj, advantage=1.0)
    full = SYSTEM + USER1 + SCAFFOLD + ANSWER1 + USER2 + SCAFFOLD + ANSWER2
    assert seq.input_ids == full
    trained = [t for t, m in zip(seq.input_ids, seq.sampled_mask, strict=True) if m]
    assert trained == ANSWER1 + ANSWER2  # the user's second question and the scaffolds are context
    assert [lp for lp, m in zip(seq.old_logprobs, seq.sampled_mask, strict=True) if m] == [
        -0.5,
        -0.25,
        -0.125,
        -1.0,
        -0.75,
    ]


def test_a_trace_without_token_ids_is_refused_in_one_line():
    (trace,) = assembled()
    trace["nodes"][2] = {**trace["nodes"][2], "token_ids": [], "mask": [], "logprobs": []}
    with pytest.raises(
        TraceError, match=r"sampled turn \(node 2\) carries no token ids.*'train'\), not 'eval'"
    ):
        trajectory_of(trace, temperature=1.0)


def test_logprobs_that_do_not_match_the_sampled_span_are_refused():
    (trace,) = assembled()
    trace["nodes"][4]["logprobs"] = [-1.0]
    with pytest.raises(TraceError, match="node 4 sampled 2 tokens but carries 1 logprobs"):
        sampled_turns(trace, 1.0)


def test_a_lost_delta_fails_the_assembly():
    assembly = TraceAssembly()
    for delta in two_turn_deltas()[:1]:
        assembly.apply(delta)
    with pytest.raises(TraceError, match="assembled 3 nodes and 1 calls, the server reports 5 and 2"):
        assembly.finish([{"id": "t1", "nodes": 5, "calls": 2}])
    with pytest.raises(TraceError, match="sent none of it"):
        assembly.finish([{"id": "other", "nodes": 0, "calls": 0}])


def test_a_missing_reward_counts_nothing():
    assert reward_of({"rewards": {"a": {"score": 0.5, "weight": 2.0}, "b": None}}) == (1.0, {"a": 0.5})


@pytest.mark.parametrize(
    ("found", "ok"), [("0.4.0", True), ("0.4.7", True), ("0.3.2", False), ("0.5.0", False)]
)
def test_the_server_refuses_a_verifiers_version_outside_the_range(monkeypatch, capsys, found, ok):
    monkeypatch.setattr("importlib.metadata.version", lambda name: found)
    if ok:
        assert verifiers_server._check_version() == found
        return
    with pytest.raises(SystemExit) as caught:
        verifiers_server._check_version()
    assert caught.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"error: verifiers {found} is installed" in err and ">= 0.4, < 0.5" in err


def verifiers_import(env_id: str):
    """Stands in for verifiers' loader: it imports the environment's package and, on a
    ModuleNotFoundError, raises one of its own ("... not found") from the original."""

    def rows(config, overrides):
        try:
            importlib.import_module(env_id)
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(f"taskset {env_id!r} not found (tried to import {env_id!r})") from exc
        return {}

    return rows


@pytest.mark.parametrize("installed", [True, False], ids=["missing a dependency", "not installed"])
def test_an_environment_that_cannot_be_imported_says_why(monkeypatch, capsys, tmp_path, installed):
    env_id = "quiz_env_that_imports_a_missing_package"
    if installed:  # its package is there, but a package it imports is not
        (tmp_path / env_id).mkdir()
        (tmp_path / env_id / "__init__.py").write_text("import sympy_is_not_installed_here\n")
        monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("importlib.metadata.version", lambda name: "0.4.0")
    monkeypatch.setattr(verifiers_server, "_rows", verifiers_import(env_id))
    config = json.dumps({"taskset": {"id": env_id}})
    with pytest.raises(SystemExit) as caught:
        verifiers_server.main(["--config", config, "--splits", "{}", "--rows", str(tmp_path / "rows.json")])
    err = capsys.readouterr().err.strip()
    assert caught.value.code == 2 and err.count("\n") == 0
    if installed:
        assert "not installed" not in err and "No module named 'sympy_is_not_installed_here'" in err, err
    else:
        assert f"verifiers environment {env_id!r} is not installed" in err, err


def test_a_settings_option_is_a_json_object():
    assert _object("taskset", '{"split": "test"}') == {"split": "test"}
    assert _object("taskset", {"split": "test"}) == {"split": "test"}
    with pytest.raises(ValueError, match="validation_taskset must be a JSON object"):
        _object("validation_taskset", "split=test")


@pytest.mark.parametrize(("module", "package"), [("zmq", "pyzmq"), ("msgpack", "msgpack")])
def test_a_missing_verifiers_extra_is_one_line_before_anything_starts(monkeypatch, tmp_path, module, package):
    monkeypatch.setitem(
        sys.modules, module, None
    )  # import finds nothing, as where the extra is not installed
    with pytest.raises(TaskLoadError) as caught:
        load_task("verifiers:capital_quiz", {"python": str(tmp_path / "no-python")})
    message = str(caught.value)
    assert "\n" not in message
    named, fix = message.split(" not installed: ")
    assert package in named.split("built: VerifiersError: ")[1] and fix.startswith(
        "pip install 'grooves[verifiers]'"
    )
    assert "task 'verifiers:capital_quiz' could not be built" in message


class ReplayedServer(VerifiersTask):
    """A verifiers task whose environment server is a replay of `two_turn_deltas`: the episode's
    traces as the server streams them, `during` run between the deltas (a trainer stepping meanwhile)."""

    def start(self) -> None:
        self.requests: list[dict] = []
        self.during = lambda: None

    async def _call(self, method, payload, on_delta=None):
        self.requests.append(payload)
        for delta in two_turn_deltas():
            on_delta(delta)
            self.during()
        return {"success": True, "head": {}, "traces": [{"id": "t1", "nodes": 5, "calls": 2}]}

    def _endpoint(self, model):
        return "http://127.0.0.1:1/v1", "unused"  # the replay reaches no server


def test_verifiers_turns_record_the_adapter_version_that_sampled_them(tiny_model_dir):
    """Rollouts ahead of the trainer sample with a pinned version (`<name>@v<N>`): its turns say N,
    so the step measures their staleness and enforces rollout.max_staleness, as for any other turn."""
    policy = TransformersPolicy(str(tiny_model_dir), lora=LoraConfig(rank=4, alpha=8), served_name="t")
    app = create_app(policy)
    pins = VersionPins(policy, [app.state.adapters], max_staleness=1)
    task = ReplayedServer("capital_quiz", python=sys.executable)
    scenario = {"id": "q", "task_data": {}}
    try:
        pinned = pins.serve(0)
        policy.adapters.bump()  # the trainer made version 1 while step 2's rollouts sample with version 0
        traj = asyncio.run(task.rollout(ModelHandle(inprocess_client(app), pinned), scenario))
        assert task.requests[-1]["model"] == "t@v0"
        assert [t.adapter_version for t in traj.turns] == [0, 0]
        group = TrajectoryGroup(trajectories=[traj])
        assert staleness_stats([group], live=1, max_staleness=1) == {
            "staleness_mean": 1.0,
            "staleness_max": 1.0,
            "staleness/0": 0.0,
            "staleness/1": 1.0,
        }
        with pytest.raises(ValueError, match=r"sampled by adapter versions \[0\].*max_staleness = 0"):
            staleness_stats([group], live=1, max_staleness=0)

        live = asyncio.run(task.rollout(ModelHandle(inprocess_client(app), "t"), scenario))
        assert [t.adapter_version for t in live.turns] == [1, 1]  # the live adapter's version

        task.during = policy.adapters.bump  # the live adapter changes in the middle of the episode
        with pytest.raises(
            VerifiersError, match=r"'t' changed from adapter version 1 to 6 during the episode"
        ):
            asyncio.run(task.rollout(ModelHandle(inprocess_client(app), "t"), scenario))
    finally:
        pins.close()
        task.close()
