"""`grooves export --format gguf`: one GGUF file that transformers' GGUF loader reads back with the
merged model's logits, laid out with llama.cpp's tensor names and tokenizer metadata."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch
from adapters_support import make_adapter
from safetensors import safe_open
from typer.testing import CliRunner

from grooves.adapters.export import ExportError, export_adapter
from grooves.adapters.to_gguf import permute_rotary
from grooves.cli import app as cli_app

IDS = torch.tensor([[1, 40, 41, 42, 77, 3, 90, 120, 5]])  # [1, 9]


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits  # [1, 9, V]


@pytest.fixture(scope="module")
def exported(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gguf-export")
    adapter = make_adapter(
        tiny_model_dir, tmp / "adapter", targets=("q_proj", "k_proj", "v_proj", "down_proj")
    )
    return export_adapter(adapter, tmp / "out", gguf_type="f32"), tmp / "out"


def test_the_f32_gguf_has_the_merged_models_logits(exported):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result, out = exported
    merged = AutoModelForCausalLM.from_pretrained(out / "merged", dtype=torch.float32).eval()
    from_gguf = AutoModelForCausalLM.from_pretrained(out, gguf_file="model.gguf", dtype=torch.float32).eval()
    assert (_logits(from_gguf) - _logits(merged)).abs().max() < 1e-5
    assert result.gguf_max_abs_logit_diff is not None and result.gguf_max_abs_logit_diff < 1e-5
    assert result.gguf["path"] == str(out / "model.gguf") and result.gguf["gguf_type"] == "f32"
    assert json.loads((out / "export.json").read_text())["gguf"] == result.gguf

    # the tokenizer travels: the same ids for text with special tokens, digits and punctuation
    text = "<|im_start|>user\nWhat's 12 + 30? Be brief.<|im_end|>\n"
    want = AutoTokenizer.from_pretrained(out / "merged")(text)["input_ids"]
    assert AutoTokenizer.from_pretrained(out, gguf_file="model.gguf")(text)["input_ids"] == want


def test_the_gguf_follows_llama_cpps_names_and_metadata(exported, tiny_model_dir):
    result, out = exported
    reader = gguf.GGUFReader(str(out / "model.gguf"))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.t")}
    config = json.loads((out / "merged" / "config.json").read_text())
    assert fields["general.architecture"] == "llama"
    assert fields["llama.block_count"] == config["num_hidden_layers"]
    assert fields["llama.attention.head_count_kv"] == config["num_key_value_heads"]
    assert fields["llama.rope.dimension_count"] == config["hidden_size"] // config["num_attention_heads"]
    assert fields["tokenizer.ggml.model"] == "gpt2"
    assert (
        fields["tokenizer.ggml.pre"] == result.gguf["pre_tokenizer"] == "default"
    )  # a tiny tokenizer of its own
    assert fields["tokenizer.ggml.eos_token_id"] == 2 and fields["tokenizer.ggml.add_bos_token"] is False
    assert fields["tokenizer.chat_template"] == (out / "merged" / "chat_template.jinja").read_text()
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) == config["vocab_size"]

    tensors = {t.name: t for t in reader.tensors}
    assert (
        "token_embd.weight" in tensors and "output.weight" not in tensors
    )  # tied head: llama.cpp reuses token_embd
    assert {f"blk.0.{n}.weight" for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_down")} <= set(
        tensors
    )
    # q and k rows in llama.cpp's interleaved rotary order: the permutation its converter applies
    with safe_open(str(out / "merged" / "model.safetensors"), framework="np") as f:
        q = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
        k = f.get_tensor("model.layers.0.self_attn.k_proj.weight")
    shape = lambda t: np.asarray(t.data).reshape(list(reversed(t.shape.tolist())))  # noqa: E731 (GGUF stores dims reversed)
    assert np.array_equal(
        shape(tensors["blk.0.attn_q.weight"]), permute_rotary(q, config["num_attention_heads"])
    )
    assert np.array_equal(
        shape(tensors["blk.0.attn_k.weight"]), permute_rotary(k, config["num_key_value_heads"])
    )
    assert not np.array_equal(permute_rotary(q, config["num_attention_heads"]), q)


def test_quantized_gguf_types_stay_close_and_norms_stay_f32(tiny_model_dir, tmp_path):
    adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    for gguf_type, bound in (("f16", 5e-3), ("q8_0", 5e-2)):
        result = export_adapter(
            adapter, tmp_path / gguf_type, gguf_type=gguf_type, merged=False, adapter=False
        )
        assert 0 < result.gguf_max_abs_logit_diff < bound, (gguf_type, result.gguf_max_abs_logit_diff)
        assert sorted(p.name for p in (tmp_path / gguf_type).iterdir()) == ["export.json", "model.gguf"]
        types = {
            t.name: t.tensor_type.name
            for t in gguf.GGUFReader(str(tmp_path / gguf_type / "model.gguf")).tensors
        }
        assert types["blk.0.attn_norm.weight"] == "F32" and types["blk.0.attn_v.weight"] == gguf_type.upper()


def test_gguf_export_refuses_other_architectures_and_the_cli_writes_it(tiny_model_dir, tmp_path):
    from tiny_models import build_tiny_model_dir

    qwen = build_tiny_model_dir(tmp_path / "qwen", architecture="qwen2")
    adapter = make_adapter(qwen, tmp_path / "qwen-adapter")
    with pytest.raises(
        ExportError, match=r"Qwen2ForCausalLM.*LlamaForCausalLM models only.*nothing was exported"
    ):
        export_adapter(adapter, tmp_path / "no", gguf_type="f16")
    assert not (tmp_path / "no").exists()

    llama_adapter = make_adapter(tiny_model_dir, tmp_path / "adapter")
    result = CliRunner().invoke(
        cli_app,
        [
            "export",
            str(llama_adapter),
            "--out",
            str(tmp_path / "out"),
            "--format",
            "gguf",
            "--gguf-type",
            "f32",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "gguf (f32" in result.output and "max |logit(gguf) - logit(merged)|" in result.output
    assert (tmp_path / "out" / "model.gguf").is_file() and (tmp_path / "out" / "merged").is_dir()
    bad = CliRunner().invoke(
        cli_app, ["export", str(llama_adapter), "--out", str(tmp_path / "x"), "--format", "onnx"]
    )
    assert bad.exit_code == 2 and "use hf or gguf" in bad.output
