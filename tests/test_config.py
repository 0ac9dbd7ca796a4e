"""Run files: one-line errors that name the field; the resolved config round-trips."""

from __future__ import annotations

import pytest

from grooves.config import ConfigError, dump_config, load_config, parse_config


def _error(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return str(info.value)


def test_unknown_field_is_named():
    msg = _error({"rollout": {"group_sise": 4}})
    assert msg == "rollout.group_sise: unknown field; check its spelling and section"


def test_wrong_type_is_named():
    msg = _error({"optim": {"lr": "fast"}})
    assert msg.startswith("optim.lr: ") and "'fast'" in msg and "\n" not in msg


@pytest.mark.parametrize(
    "data,field",
    [({"rollout": {"group_size": 1}}, "rollout.group_size"), ({"optim": {"lr": 0}}, "optim.lr"),
     ({"optim": {"lr": -1e-5}}, "optim.lr"), ({"steps": 0}, "steps"), ({"lora": {"rank": 0}}, "lora.rank")],
)  # fmt: skip
def test_impossible_values(data, field):
    msg = _error(data)
    assert msg.startswith(f"{field}: ") and "\n" not in msg


def test_an_unknown_matmul_form_names_the_field_and_the_choices():
    msg = _error({"model": {"matmul_forms": "fastest"}})
    assert msg.startswith("model.matmul_forms: ") and "'timed_head'" in msg and "'fixed'" in msg and "\n" not in msg


def test_load_and_round_trip(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('name = "x"\nsteps = 3\n[rollout]\ngroup_size = 4\n[algorithm]\nloss = "cispo"\n')
    config = load_config(path)
    assert (config.steps, config.rollout.group_size, config.algorithm.loss) == (3, 4, "cispo")
    path.write_text(dump_config(config))
    assert load_config(path) == config


def test_bad_toml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="no such run file"):
        load_config(tmp_path / "nope.toml")
