"""`model.init_adapter`: an RL run starts from a trained adapter (an SFT warm start), or is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from grooves.config import ConfigError, check_against_model, parse_config, parse_sft_config
from grooves.training.loop import train
from grooves.training.session import build_policy
from grooves.training.sft import sft


@pytest.fixture(scope="module")
def sft_run(tiny_model_dir, tmp_path_factory):
    """Two SFT steps on the tiny model: a non-zero adapter in a checkpoint, as `grooves sft` writes it."""
    tmp = tmp_path_factory.mktemp("sft")
    data = tmp / "chats.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"hello {i}"},
                        {"role": "assistant", "content": "yes"},
                    ]
                }
            )
            + "\n"
            for i in range(4)
        )
    )
    config = parse_sft_config(
        {
            "data": str(data),
            "output_dir": str(tmp / "run"),
            "batch_size": 2,
            "steps": 2,
            "model": {"base_model": str(tiny_model_dir)},
            "lora": {"rank": 4, "alpha": 8},
            "optim": {"lr": 1e-2},
            "logging": {"progress": False},
            "checkpoint": {"every": 2},
        }
    )
    return sft(config)


def _config(model_dir, out, init, algorithm=None, **lora):
    return parse_config(
        {
            "algorithm": algorithm or {},
            "name": "warm",
            "output_dir": str(out),
            "seed": 1,
            "steps": 1,
            "task": "toy_tokens",
            "task_options": {"vocab_size": 487, "num_scenarios": 4},
            "model": {"base_model": str(model_dir), "init_adapter": str(init)},
            "rollout": {"group_size": 8, "groups_per_step": 4, "max_tokens": 4},
            "optim": {"lr": 1e-2},
            "lora": {"rank": 4, "alpha": 8, **lora},
            "validation": {"every": 0, "scenarios": 2},
            "logging": {"progress": False, "report": False},
        }
    )


def _lora_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


@pytest.mark.parametrize("which", ["checkpoint", "adapter", "run"])
def test_the_run_starts_from_the_adapters_weights_and_trains_them(sft_run, tiny_model_dir, tmp_path, which):
    checkpoint = sft_run / "checkpoints" / "step_000002"
    init = {"checkpoint": checkpoint, "adapter": checkpoint / "adapter", "run": sft_run}[which]
    config = _config(tiny_model_dir, tmp_path / "rl", init)
    check_against_model(config)
    policy = build_policy(config)
    saved = load_file(str(checkpoint / "adapter" / "adapter_model.safetensors"))
    weights = _lora_weights(policy.model)
    assert len(weights) == len(saved) > 0
    for name, value in weights.items():
        key = name.replace(".default", "")
        assert torch.equal(value, saved[key]), name
    assert any(
        bool(v.abs().sum() > 0) for k, v in weights.items() if "lora_B" in k
    )  # trained: B is no longer zero
    assert all(p.requires_grad for n, p in policy.model.named_parameters() if "lora_" in n)
    if which != "checkpoint":
        return
    run_dir = train(config)
    after = load_file(str(run_dir / "checkpoints" / "step_000001" / "adapter" / "adapter_model.safetensors"))
    moved = [k for k in saved if not torch.equal(saved[k], after[k])]
    assert moved  # RL updated the warm-started weights, starting from them
    assert max(float((saved[k] - after[k]).abs().max()) for k in saved) < 0.1  # one small step away


def test_an_adapter_of_another_base_model_is_refused_in_one_line(sft_run, peaked_model_dir, tmp_path):
    config = _config(peaked_model_dir, tmp_path / "rl", sft_run / "checkpoints" / "step_000002")
    with pytest.raises(ConfigError) as err:
        check_against_model(config)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        f"model.init_adapter: {sft_run / 'checkpoints' / 'step_000002'} was trained on base model "
    )
    assert f"not {str(peaked_model_dir)!r} (model.base_model)" in message
    with pytest.raises(ConfigError, match="was trained on base model"):
        train(config)  # refused before any weights load or the folder changes
    assert not (tmp_path / "rl" / "config.toml").exists()


def test_another_lora_shape_or_a_missing_adapter_is_refused(sft_run, tiny_model_dir, tmp_path):
    config = _config(tiny_model_dir, tmp_path / "rl", sft_run, rank=8, alpha=16)
    with pytest.raises(
        ConfigError,
        match=r"^model.init_adapter: .* has LoRA rank 4, alpha 8.0 on .*; set \[lora\] "
        r"rank = 4, alpha = 8.0, target_modules = .* to continue it$",
    ):
        check_against_model(config)
    config = _config(tiny_model_dir, tmp_path / "rl", tmp_path / "nowhere")
    with pytest.raises(ConfigError, match=r"^model.init_adapter: .*nowhere: no such folder; pass e.g. "):
        check_against_model(config)
    (tmp_path / "empty").mkdir()
    config = _config(tiny_model_dir, tmp_path / "rl", tmp_path / "empty")
    with pytest.raises(
        ConfigError, match="not an adapter folder, a checkpoint or a run folder with checkpoints"
    ):
        check_against_model(config)


def test_the_commands_refuse_an_adapter_of_another_base_model_in_one_line(
    sft_run, peaked_model_dir, tmp_path
):
    import tomli_w
    from typer.testing import CliRunner

    from grooves.cli import app as cli_app

    adapter = sft_run / "checkpoints" / "step_000002"
    run_file = tmp_path / "rl.toml"
    run_file.write_text(
        tomli_w.dumps(
            _config(peaked_model_dir, tmp_path / "rl", adapter).model_dump(mode="json", exclude_none=True)
        )
    )
    rl = CliRunner().invoke(cli_app, ["train", str(run_file)])
    sft_cli = CliRunner().invoke(
        cli_app,
        [
            "sft",
            "--data",
            str(tmp_path / "none.jsonl"),
            "--model",
            str(peaked_model_dir),
            "-o",
            str(tmp_path / "s"),
            "--set",
            f'model.init_adapter="{adapter}"',
            "--set",
            "lora.rank=4",
            "--set",
            "lora.alpha=8",
        ],
    )
    for result, code in [(rl, 2), (sft_cli, 2)]:
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == code and len(lines) == 1, result.output
        assert f"model.init_adapter: {adapter} was trained on base model " in lines[0]
        assert "Traceback" not in result.output
    assert not (tmp_path / "s").exists()  # refused before the folder or the model


@pytest.mark.parametrize("reference", ["start", "base"])
def test_the_kl_penalty_compares_with_the_adapter_the_run_started_from(
    sft_run, tiny_model_dir, tmp_path, reference
):
    """kl_reference = "start": the first step's policy is the reference, so its KL is 0; "base": the
    warm-started adapter is measured against the base model, which it differs from."""
    checkpoint = sft_run / "checkpoints" / "step_000002"
    config = _config(
        tiny_model_dir,
        tmp_path / reference,
        checkpoint,
        algorithm={"kl_beta": 0.1, "kl_reference": reference},
    )
    run_dir = train(config)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if "kl_mean" in r)
    assert first["step"] == 1
    if reference == "start":
        assert abs(first["kl_mean"]) < 1e-7
    else:
        assert first["kl_mean"] > 1e-4
    saved = load_file(str(checkpoint / "adapter" / "adapter_model.safetensors"))
    after = load_file(str(run_dir / "checkpoints" / "step_000001" / "adapter" / "adapter_model.safetensors"))
    assert after.keys() == saved.keys()  # the frozen reference is not part of the checkpoint
    assert any(not torch.equal(saved[k], after[k]) for k in saved)  # the trained adapter still trains


def test_the_kl_reference_loads_frozen_and_leaves_the_trained_adapter_active(
    sft_run, tiny_model_dir, tmp_path
):
    from grooves.training.step import KL_REFERENCE, load_kl_reference, reference_weights

    checkpoint = sft_run / "checkpoints" / "step_000002"
    policy = build_policy(_config(tiny_model_dir, tmp_path / "rl", checkpoint))
    model = policy.model
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    load_kl_reference(model, checkpoint / "adapter")
    assert model.active_adapter == "default"
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == [n for n, flag in before.items() if flag]  # the reference's weights are frozen
    assert all(".default." in n for n in trainable)
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        own = model(input_ids=ids).logits
        with reference_weights(model):
            ref = model(input_ids=ids).logits
        with model.disable_adapter():
            base = model(input_ids=ids).logits
    assert torch.allclose(own, ref, atol=1e-6)  # the same weights under another name
    assert not torch.allclose(own, base, atol=1e-4)
    assert model.active_adapter == "default"
    assert [n for n, p in model.named_parameters() if p.requires_grad] == trainable
    assert KL_REFERENCE in model.peft_config


def test_a_resumed_run_with_an_sft_stage_takes_the_stages_adapter_as_kl_reference(
    sft_run, tiny_model_dir, tmp_path
):
    import shutil

    from grooves.config import resolve_init_adapter
    from grooves.training.session import kl_start_adapter

    run_dir = tmp_path / "run"
    shutil.copytree(sft_run, run_dir / "sft")
    data = _config(tiny_model_dir, run_dir, sft_run, algorithm={"kl_beta": 0.1}).model_dump(mode="json")
    data["model"]["init_adapter"] = None  # as the run file says: the stage sets it at the start only
    data["sft"] = {"data": str(tmp_path / "demos.jsonl")}
    config = parse_config(data)
    assert kl_start_adapter(config, run_dir) == resolve_init_adapter(str(run_dir / "sft"))
    assert (kl_start_adapter(config, run_dir) / "adapter_config.json").is_file()
    base = config.model_copy(
        update={"algorithm": config.algorithm.model_copy(update={"kl_reference": "base"})}
    )
    assert kl_start_adapter(base, run_dir) is None
    off = config.model_copy(update={"algorithm": config.algorithm.model_copy(update={"kl_beta": 0.0})})
    assert kl_start_adapter(off, run_dir) is None


def test_a_run_with_a_kl_reference_resumes_from_its_checkpoint(sft_run, tiny_model_dir, tmp_path):
    """The checkpoint holds the trained adapter alone; the reference loaded beside it is not
    missing from it, and the resumed step still measures KL against the starting adapter."""
    checkpoint = sft_run / "checkpoints" / "step_000002"
    config = _config(tiny_model_dir, tmp_path / "rl", checkpoint, algorithm={"kl_beta": 0.1})
    run_dir = train(config)
    train(config.model_copy(update={"steps": 2}), resume=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    kl = {r["step"]: r["kl_mean"] for r in rows if "kl_mean" in r}
    assert sorted(kl) == [1, 2]
    assert abs(kl[1]) < 1e-7 and kl[2] > 1e-6  # step 1 trained away from the reference
    assert (run_dir / "checkpoints" / "step_000002").is_dir()
