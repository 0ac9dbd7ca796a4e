"""`grooves weights diff`: update norms equal a hand computation and peft's own merged weights."""

from __future__ import annotations

import json
import math

import pytest
import torch
from adapters_support import make_adapter
from safetensors.torch import load_file
from typer.testing import CliRunner

from grooves.adapters.drift import DriftError, LoraFactors, drift_table, update_inner, update_sq_norm
from grooves.cli import app as cli_app

Q = "base_model.model.model.layers.0.self_attn.q_proj"


def _set_factors(adapter_dir, a_q: torch.Tensor, b_q: torch.Tensor, zero_others: bool = True):
    """Overwrite layer 0's q_proj factors (and zero every other update) in a saved adapter."""
    from safetensors.torch import save_file

    path = adapter_dir / "adapter_model.safetensors"
    tensors = load_file(str(path))
    for key in tensors:
        if zero_others and ".lora_B." in key:
            tensors[key] = torch.zeros_like(tensors[key])
    tensors[f"{Q}.lora_A.weight"] = a_q.clone()
    tensors[f"{Q}.lora_B.weight"] = b_q.clone()
    save_file(tensors, str(path))


def _q_weight_norm(model_dir) -> float:
    return float(
        load_file(str(model_dir / "model.safetensors"))["model.layers.0.self_attn.q_proj.weight"]
        .double()
        .norm()
    )


def test_norms_equal_a_hand_computation(tiny_model_dir, tmp_path):
    a_dir = make_adapter(tiny_model_dir, tmp_path / "a")
    b_dir = make_adapter(tiny_model_dir, tmp_path / "b", seed=1)
    A = torch.zeros(2, 32)
    A[0, 0], A[1, 1] = 1.0, 2.0
    B = torch.zeros(32, 2)
    B[0, 0], B[1, 1] = 3.0, 4.0
    _set_factors(a_dir, A, B)
    _set_factors(b_dir, -A, B)  # dW_b = -dW_a
    # scale = alpha / r = 2; B A has 3 at (0, 0) and 8 at (1, 1): ||dW|| = 2 sqrt(9 + 64)
    expected = 2 * math.sqrt(73)
    w = _q_weight_norm(tiny_model_dir)
    rows = drift_table([a_dir, b_dir], group="module")
    q = next(r for r in rows if r.name == "model.layers.0.self_attn.q_proj")
    assert q.weight_norm == pytest.approx(w, rel=1e-9)
    assert q.update_norms == pytest.approx([expected, expected], rel=1e-9)
    assert q.relative == pytest.approx([expected / w, expected / w], rel=1e-9)
    assert q.relative_diff == pytest.approx(2 * expected / w, rel=1e-9)
    assert q.cosine == pytest.approx(-1.0, abs=1e-12)
    others = [r for r in rows if r is not q]
    assert others and all(r.update_norms == [0.0, 0.0] and r.cosine == 0.0 for r in others)


def test_low_rank_identities_match_materialized_products():
    g = torch.Generator().manual_seed(0)
    f = LoraFactors(
        torch.randn(3, 7, generator=g, dtype=torch.float64),
        torch.randn(5, 3, generator=g, dtype=torch.float64),
        0.5,
    )
    h = LoraFactors(
        torch.randn(2, 7, generator=g, dtype=torch.float64),
        torch.randn(5, 2, generator=g, dtype=torch.float64),
        3.0,
    )
    df, dh = f.scale * f.b @ f.a, h.scale * h.b @ h.a
    assert update_sq_norm(f) == pytest.approx(float(df.pow(2).sum()), rel=1e-12)
    assert update_inner(f, h) == pytest.approx(float((df * dh).sum()), rel=1e-12)


@pytest.mark.parametrize("extra", [{}, {"use_rslora": True}, {"alpha_pattern": {"v_proj": 16.0}}])
def test_norms_match_peft_merged_weights(tiny_model_dir, tmp_path, extra):
    """Whatever the scaling rule, ||dW|| equals ||W_merged - W|| from peft's own merge."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = make_adapter(
        tiny_model_dir, tmp_path / "a", rank=3, alpha=6.0, targets=("q_proj", "v_proj", "down_proj"), **extra
    )
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    merged = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(adapter)
    ).merge_and_unload()
    merged_sd = merged.state_dict()
    rows = drift_table([adapter], group="module")
    assert len(rows) == 2 * 3  # two layers x three targets
    for r in rows:
        w = base[f"{r.name}.weight"].double()
        delta = merged_sd[f"{r.name}.weight"].double() - w
        assert r.relative[0] == pytest.approx(float(delta.norm() / w.norm()), rel=1e-4), r.name
    block = drift_table([adapter], group="block")
    assert [r.name for r in block] == ["layer   0", "layer   1"]
    layer0 = [r for r in rows if ".layers.0." in r.name]
    assert block[0].update_norms[0] == pytest.approx(
        math.sqrt(sum(r.update_norms[0] ** 2 for r in layer0)), rel=1e-12
    )


def test_cli_prints_json_and_table(tiny_model_dir, tmp_path):
    a = make_adapter(tiny_model_dir, tmp_path / "a")
    b = make_adapter(tiny_model_dir, tmp_path / "b", seed=1)
    runner = CliRunner()
    result = runner.invoke(cli_app, ["weights", "diff", str(a), str(b), "--json", "--group", "kind"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert [r["name"] for r in body["rows"]] == ["q_proj", "v_proj"]
    assert body["total"]["relative_diff"] > 0 and -1 <= body["total"]["cosine"] <= 1
    table = runner.invoke(cli_app, ["weights", "diff", str(a)])
    assert table.exit_code == 0 and "layer   1" in table.output and "total" in table.output


def test_dora_is_refused(tiny_model_dir, tmp_path):
    a = make_adapter(tiny_model_dir, tmp_path / "dora", use_dora=True)
    with pytest.raises(DriftError, match="DoRA"):
        drift_table([a])
