"""Experiment trackers: a run's metrics, config and sample tables, read back with each library's reader."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import pytest

from grooves.config import parse_config
from grooves.training.loop import train
from grooves.training.trackers import COLUMNS

TRACKERS = ["tensorboard", "wandb", "mlflow", "trackio"]


@pytest.fixture(scope="module")
def trackio_dir(tmp_path_factory):
    """Trackio reads $TRACKIO_DIR once, when imported: set it first, so the test writes no home folder."""
    folder = tmp_path_factory.mktemp("trackio")
    old = os.environ.get("TRACKIO_DIR")
    os.environ["TRACKIO_DIR"] = str(folder)
    if "trackio" in sys.modules:
        import trackio.utils

        assert trackio.utils.TRACKIO_DIR == folder, "trackio was imported before its folder was set"
    yield folder
    if old is None:
        os.environ.pop("TRACKIO_DIR", None)
    else:
        os.environ["TRACKIO_DIR"] = old


def _config(model_dir, out, report_to, **logging):
    return parse_config(
        {
            "name": "toy",
            "output_dir": str(out),
            "seed": 1,
            "steps": 3,
            "task": "toy_tokens",
            "task_options": {"vocab_size": 487, "num_scenarios": 16},
            "model": {"base_model": str(model_dir)},
            "rollout": {"group_size": 4, "groups_per_step": 2, "max_tokens": 4},
            "optim": {"lr": 5e-2, "lr_schedule": "linear"},
            "lora": {"rank": 4, "alpha": 8},
            "validation": {"every": 2, "scenarios": 4},
            "logging": {
                "progress": False,
                "report": False,
                "report_to": report_to,
                "project": "grooves-test",
                **logging,
            },
        }
    )


def _rows(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def tracked_run(peaked_model_dir, tmp_path_factory, trackio_dir):
    for library in ("torch.utils.tensorboard", "wandb", "mlflow", "trackio", "pandas"):
        pytest.importorskip(
            library, reason="the tracker extras: pip install -e '.[trackers]' (make setup installs them)"
        )
    out = tmp_path_factory.mktemp("tracked") / "run"
    mp = pytest.MonkeyPatch()
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    try:
        run_dir = train(_config(peaked_model_dir, out, TRACKERS))
    finally:
        mp.undo()
    return run_dir, _rows(run_dir)


def test_tensorboard_holds_the_runs_scalars_config_and_samples(tracked_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, rows = tracked_run
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    for key in ("reward_mean", "loss", "lr", "val/success_rate"):
        logged = {e.step: e.value for e in events.Scalars(key)}
        expected = {s: r[key] for s, r in rows.items() if r.get(key) is not None}
        assert logged.keys() == expected.keys(), key
        for step, value in expected.items():
            assert logged[step] == pytest.approx(value, rel=1e-6), (key, step)
    texts = events.Tags()["tensors"]
    assert {"config/text_summary", "samples/step/text_summary", "samples/validation/text_summary"} <= set(
        texts
    )
    config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert 'lr_schedule = "linear"' in config
    table = events.Tensors("samples/step/text_summary")[-1]
    assert table.step == 3
    lines = table.tensor_proto.string_val[0].decode().splitlines()
    assert lines[0] == "| " + " | ".join(COLUMNS) + " |"
    assert len(lines) == 2 + 2 * 4  # header, rule, one row per rollout of step 3


def _wandb_records(run_file: Path):
    """The records of a W&B transaction log (.wandb): its 7-byte header, then LevelDB log blocks of
    32 KiB whose chunks (7-byte header: crc32, length, type full/first/middle/last) carry
    wandb's `Record` protobufs. The library parses it in its Go core; this reads it with its
    own protobuf schema."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            pos += block - pos % block if pos % block else 0
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def test_wandb_offline_run_holds_the_runs_scalars_config_and_tables(tracked_run):
    run_dir, rows = tracked_run
    (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    history: dict[int, dict] = {}
    config: dict = {}
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            history.setdefault(int(items["_step"]), {}).update(items)
        elif kind in ("run", "config"):
            updates = record.run.config.update if kind == "run" else record.config.update
            config.update({u.key: json.loads(u.value_json) for u in updates})
    for step, row in rows.items():
        for key in ("reward_mean", "lr", "val/success_rate"):
            if row.get(key) is not None:
                assert history[step][key] == pytest.approx(row[key], rel=1e-9), (step, key)
    assert config["optim"]["lr_schedule"] == "linear" and config["steps"] == 3
    assert history[3]["samples/step/_type"] == "table-file" and history[3]["samples/step/nrows"] == 8
    (table_file,) = (run_file.parent / "files").glob("media/table/samples/step_3_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == list(COLUMNS) and len(table["data"]) == 8


def test_mlflow_file_store_holds_the_runs_metrics_params_and_tables(tracked_run, monkeypatch):
    from mlflow import MlflowClient

    run_dir, rows = tracked_run
    store = (run_dir / "mlruns").resolve().as_uri()
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):  # load_table opens a client of its own
        monkeypatch.setenv(name, store)
    client = MlflowClient(tracking_uri=store, registry_uri=store)
    experiment = client.get_experiment_by_name("grooves-test")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "toy" and run.info.status == "FINISHED"
    assert json.loads((run_dir / "trackers.json").read_text())["mlflow"] == run.info.run_id
    for key in ("reward_mean", "lr", "val/success_rate"):
        history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        expected = {s: r[key] for s, r in rows.items() if r.get(key) is not None}
        assert history == pytest.approx(expected, rel=1e-9), key
    assert run.data.params["optim.lr_schedule"] == "linear" and run.data.params["rollout.group_size"] == "4"
    table = client.load_table(
        experiment.experiment_id, "samples/validation_000002.json", run_ids=[run.info.run_id]
    )
    assert list(table.columns)[:5] == list(COLUMNS) and len(table) == 4


def test_trackio_holds_the_runs_metrics_config_and_tables(tracked_run):
    from trackio.sqlite_storage import SQLiteStorage

    run_dir, rows = tracked_run
    logs = SQLiteStorage.get_logs("grooves-test", "toy")
    logged: dict[int, dict] = {}
    for entry in logs:
        logged.setdefault(entry["step"], {}).update(entry)
    for step, row in rows.items():
        for key in ("reward_mean", "lr", "val/success_rate"):
            if row.get(key) is not None:
                assert logged[step][key] == pytest.approx(row[key], rel=1e-9), (step, key)
    table = logged[3]["samples/step"]
    assert table["_type"] == "trackio.table" and len(table["_value"]) == 8
    assert set(table["_value"][0]) == set(COLUMNS)
    assert SQLiteStorage.get_run_config("grooves-test", "toy")["optim"]["lr_schedule"] == "linear"


def test_a_tracker_that_cannot_start_is_one_line_and_the_run_goes_on(
    peaked_model_dir, tmp_path, monkeypatch, capsys
):
    pytest.importorskip("torch.utils.tensorboard", reason="the tensorboard extra")
    pytest.importorskip("mlflow", reason="the mlflow extra")
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: `import wandb` raises ImportError
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://x")  # mlflow refuses the store
    config = _config(peaked_model_dir, tmp_path / "run", ["wandb", "mlflow", "tensorboard"])
    run_dir = train(config)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("logging.report_to")]
    assert len(err) == 2, err
    assert err[0].startswith("logging.report_to: wandb is not installed (")
    assert err[0].endswith("pip install 'grooves[wandb]'; the run goes on without it")
    assert err[1].startswith("logging.report_to: mlflow did not start (") and "nosuchscheme" in err[1]
    assert max(_rows(run_dir)) == 3  # every step ran
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))  # the tracker that started wrote


def test_a_tracker_that_fails_mid_run_is_dropped_with_one_line(capsys):
    from grooves.training.trackers import Trackers

    class Broken:
        name = "broken"

        def log(self, step, metrics):
            raise OSError("disk full")

    class Kept:
        name = "kept"
        seen: list = []

        def log(self, step, metrics):
            self.seen.append((step, metrics))

    trackers = Trackers([Broken(), Kept()])
    trackers.log({"step": 1, "loss": 0.5, "val/x": None, "flag": True})
    trackers.log({"step": 2, "loss": float("nan")})
    assert Kept.seen == [(1, {"loss": 0.5}), (2, {})]  # non-numbers and non-finite values are left out
    assert capsys.readouterr().err.splitlines() == [
        "logging.report_to: broken failed (OSError: disk full); the run goes on without it"
    ]


def test_report_to_names_only_known_trackers_once():
    from grooves.config import ConfigError

    with pytest.raises(ConfigError, match=r"logging.report_to.0: Input should be 'tensorboard', 'wandb'"):
        parse_config({"logging": {"report_to": ["neptune"]}})
    with pytest.raises(ConfigError, match="names a tracker twice"):
        parse_config({"logging": {"report_to": ["wandb", "wandb"]}})
