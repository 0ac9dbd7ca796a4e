"""`grooves export`: the merged model is a plain transformers model with the adapter's logits."""

from __future__ import annotations

import json

import pytest
import torch
from adapters_support import make_adapter, make_run
from safetensors import safe_open
from typer.testing import CliRunner

from grooves.adapters.export import ExportError, export_adapter
from grooves.cli import app as cli_app

IDS = torch.tensor([[1, 40, 41, 42, 77, 3, 90, 120, 5]])  # [1, 9]


def _adapter_logits(model_dir, adapter_dir) -> torch.Tensor:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(model_dir), str(adapter_dir)
    ).eval()
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_merged_export_reproduces_the_adapter(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = make_adapter(
        tiny_model_dir, tmp_path / "adapter", targets=("q_proj", "v_proj", "gate_proj", "down_proj")
    )
    result = export_adapter(adapter, tmp_path / "out")
    merged_dir = tmp_path / "out" / "merged"
    with safe_open(str(merged_dir / "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    assert keys and not any("lora" in k for k in keys)  # a plain checkpoint: no adapter tensors left
    assert json.loads((merged_dir / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert AutoTokenizer.from_pretrained(merged_dir).chat_template  # tokenizer and chat template travel along

    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        got = merged(input_ids=IDS).logits
    want = _adapter_logits(tiny_model_dir, adapter)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        plain = base(input_ids=IDS).logits
    assert (want - plain).abs().max() > 1e-2  # the adapter really changes the logits
    assert (got - want).abs().max() < 1e-4
    assert result.max_abs_logit_diff is not None and result.max_abs_logit_diff < 1e-4
    assert (
        json.loads((tmp_path / "out" / "export.json").read_text())["max_abs_logit_diff"]
        == result.max_abs_logit_diff
    )

    # the adapter alone, in peft format, loads on the base and gives the same logits
    again = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(tmp_path / "out" / "adapter")
    ).eval()
    with torch.no_grad():
        assert torch.equal(again(input_ids=IDS).logits, want)


def test_bfloat16_export_writes_bf16_weights(tiny_model_dir, tmp_path):
    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    result = export_adapter(adapter, tmp_path / "out", dtype="bfloat16", adapter=False)
    with safe_open(str(tmp_path / "out" / "merged" / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor(next(iter(f.keys()))).dtype == torch.bfloat16
    assert result.adapter_dir is None and not (tmp_path / "out" / "adapter").exists()
    assert 0 < result.max_abs_logit_diff < 0.5  # rounding to bf16, measured and reported


def test_export_errors(tmp_path):
    with pytest.raises(ExportError, match="adapter_config.json"):
        export_adapter(tmp_path, tmp_path / "out")
    with pytest.raises(ExportError, match="nothing to export"):
        export_adapter(tmp_path, tmp_path / "out", merged=False, adapter=False)


def test_cli_exports_the_best_checkpoint_of_a_run(tiny_model_dir, tmp_path):
    run = make_run(tmp_path / "run", {1: 0.2, 2: 0.9, 3: 0.5}, model_dir=tiny_model_dir)
    result = CliRunner().invoke(
        cli_app, ["export", str(run), "--select", "best", "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "export.json").read_text())
    assert manifest["adapter_source"].endswith("step_000002/adapter")
    assert manifest["max_abs_logit_diff"] < 1e-4


def test_an_adapter_with_nan_or_inf_weights_is_not_exported(tiny_model_dir, tmp_path):
    from adapters_support import poison_adapter

    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    name = poison_adapter(adapter, float("inf"))
    with pytest.raises(ExportError) as info:
        export_adapter(adapter, tmp_path / "out")
    assert str(info.value) == (
        f"{adapter}: 1 of 8 weight tensors hold NaN or inf (first: {name}); the run diverged before this checkpoint: "
        "pick an earlier one; nothing was exported"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]  # no output, no temporary folder
    result = CliRunner().invoke(cli_app, ["export", str(adapter), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "hold NaN or inf" in result.output and "Traceback" not in result.output


def test_export_refuses_a_non_empty_out_and_with_overwrite_replaces_it_whole(tiny_model_dir, tmp_path):
    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    out = tmp_path / "exported"
    out.mkdir()
    (out / "stale.txt").write_text("from an earlier export")
    with pytest.raises(ExportError, match=rf"^--out {out} is not empty; pass --overwrite to replace it"):
        export_adapter(adapter, out)
    assert [p.name for p in out.iterdir()] == ["stale.txt"]
    result = CliRunner().invoke(cli_app, ["export", str(adapter), "--out", str(out), "--no-merged"])
    assert result.exit_code == 1 and "pass --overwrite" in result.output

    result = CliRunner().invoke(cli_app, ["export", str(adapter), "--out", str(out), "--overwrite"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter",
        "export.json",
        "merged",
    ]  # nothing of the old folder
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "adapter",
        "exported",
    ]  # no temporary or set-aside folder left
    assert json.loads((out / "export.json").read_text())["merged_dir"] == str(out / "merged")
    (tmp_path / "empty").mkdir()
    assert export_adapter(adapter, tmp_path / "empty", merged=False).adapter_dir == str(
        tmp_path / "empty" / "adapter"
    )
