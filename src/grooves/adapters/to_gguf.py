"""A merged Llama model as one GGUF file, the format llama.cpp and the runtimes built on it load.

`write_gguf` reads a Hugging Face folder (what `grooves export` writes to `merged/`) and writes what
llama.cpp's own converter (`convert_hf_to_gguf.py`, class `LlamaModel`) writes for it:

- metadata: `general.architecture = "llama"`, the `llama.*` hyperparameters (context length,
  embedding and feed-forward sizes, block count, head counts, rope dimension and base, RMS-norm
  epsilon, vocabulary size), `general.file_type`;
- tensors under llama.cpp's names (`token_embd`, `blk.N.attn_q`, ..., `output_norm`, `output`
  unless tied), mapped by the `gguf` package's own `TensorNameMap`. The q and k projections are
  permuted from Hugging Face's rotary layout (first half / second half of each head) to llama.cpp's
  interleaved pairs, as `LlamaModel.permute` does: rows (head, 2, d/2) -> (head, d/2, 2). Norms and
  other 1-D tensors stay float32 whatever the file type;
- the tokenizer as llama.cpp's `gpt2` model (byte-level BPE: SmolLM2, Llama 3, Qwen2 tokenizers):
  every id's token text and type (control for special added tokens, user-defined for other added
  tokens, `[PADn]` unused for ids without a token), the merges, the special token ids, whether a
  BOS token is prepended, and the chat template (`gguf.SpecialVocab`, as the converter uses it).
  `tokenizer.ggml.pre` names the pre-tokenizer (how text is split before BPE); llama.cpp tells them
  apart by the sha256 of the token ids of one probe text, and the few families grooves trains are
  recognised the same way. An unrecognised one is written as `default` (llama.cpp then splits text
  with its default pattern, which may tokenize some text differently), and the result says so.

Only Llama-architecture models (`LlamaForCausalLM`) with a byte-level BPE tokenizer are written;
anything else is refused with the converter to use instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from typing import Literal

import numpy as np

GgufType = Literal["f32", "f16", "bf16", "q8_0"]
GGUF_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0")

# llama.cpp identifies a BPE pre-tokenizer by sha256(str(tokenizer.encode(PROBE))); these are the
# digests its converter lists for the families grooves trains (convert_hf_to_gguf.py,
# get_vocab_base_pre).
PROBE = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) "
    "✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 "
    "?我想在apple工作1314151天～ ------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? "
    "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
PRE_TOKENIZERS = {
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",
}


class GgufError(ValueError):
    """A model this writer cannot express as GGUF; the message names what and the alternative."""


@dataclass(frozen=True)
class GgufInfo:
    path: str
    gguf_type: str
    tensors: int
    pre_tokenizer: str
    """`tokenizer.ggml.pre`; `default` when the tokenizer's family was not recognised."""
    bytes: int


def permute_rotary(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Hugging Face q/k rows -> llama.cpp's layout: within each head, row j of the first half and
    row j of the second half become rows 2j and 2j + 1 (rotary pairs interleaved).

    >>> permute_rotary(np.arange(8).reshape(8, 1), n_head=2).ravel().tolist()
    [0, 2, 1, 3, 4, 6, 5, 7]
    """
    rows = weight.shape[0]
    return (
        weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def pre_tokenizer_name(tokenizer) -> str:
    """llama.cpp's name for the tokenizer's pre-tokenizer, or `default` when it is not one of
    `PRE_TOKENIZERS`."""
    digest = sha256(str(tokenizer.encode(PROBE)).encode()).hexdigest()
    return PRE_TOKENIZERS.get(digest, "default")


def _vocab(tokenizer, vocab_size: int) -> tuple[list[str], list[int]]:
    """Token text and type per id, as llama.cpp's converter lists them for a gpt2-style vocabulary."""
    import gguf

    reverse = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens: list[str] = []
    types: list[int] = []  # gguf.TokenType values (an IntEnum)
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = reverse[i]
        if token in added:
            special = decoder[i].special or (token.startswith("<|") and token.endswith("|>"))
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(token)
    return tokens, types


def _check_supported(model_dir: Path, config: dict) -> None:
    archs = config.get("architectures") or []
    if archs != ["LlamaForCausalLM"]:
        raise GgufError(
            f"{model_dir}: architecture {archs or 'unknown'}; GGUF export writes LlamaForCausalLM models only "
            "(convert others with llama.cpp's convert_hf_to_gguf.py from the merged folder)"
        )
    tok = json.loads((model_dir / "tokenizer.json").read_text()).get("model", {})
    if tok.get("type") != "BPE" or not tok.get("merges"):
        raise GgufError(
            f"{model_dir}: the tokenizer is not byte-level BPE (a sentencepiece one needs llama.cpp's "
            "convert_hf_to_gguf.py); GGUF export writes gpt2-style tokenizers only"
        )
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise GgufError(
            f"{model_dir}: rope scaling {rope.get('rope_type')!r} is not written; only plain rope"
        )


def write_gguf(model_dir: str | Path, out_file: str | Path, *, gguf_type: GgufType = "f16") -> GgufInfo:
    """Write the Hugging Face Llama model in `model_dir` as one GGUF file (module docstring)."""
    import gguf
    import torch
    from safetensors import safe_open
    from transformers import AutoTokenizer

    if gguf_type not in GGUF_TYPES:
        raise GgufError(f"gguf type {gguf_type!r}: use one of {', '.join(GGUF_TYPES)}")
    model_dir, out_file = Path(model_dir), Path(out_file)
    config = json.loads((model_dir / "config.json").read_text())
    _check_supported(model_dir, config)
    n_head, n_kv = (
        config["num_attention_heads"],
        config.get("num_key_value_heads", config["num_attention_heads"]),
    )
    head_dim = config.get("head_dim") or config["hidden_size"] // n_head
    qtype = {
        "f32": gguf.GGMLQuantizationType.F32,
        "f16": gguf.GGMLQuantizationType.F16,
        "bf16": gguf.GGMLQuantizationType.BF16,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
    }[gguf_type]
    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "bf16": gguf.LlamaFileType.MOSTLY_BF16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[gguf_type]

    writer = gguf.GGUFWriter(str(out_file), "llama")
    writer.add_name(model_dir.name)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    rope = config.get("rope_parameters") or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if config.get("head_dim"):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_file_type(file_type)
    writer.add_vocab_size(config["vocab_size"])
    writer.add_rope_dimension_count(head_dim)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pre = pre_tokenizer_name(tokenizer)
    tokens, types = _vocab(tokenizer, config["vocab_size"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    special = gguf.SpecialVocab(model_dir, load_merges=True)
    special.add_special_token["bos"] = bool(
        tokenizer.bos_token_id is not None and tokenizer("a")["input_ids"][:1] == [tokenizer.bos_token_id]
    )
    special.add_to_gguf(writer, quiet=True)
    tokenizer_config = model_dir / "tokenizer_config.json"
    if tokenizer_config.is_file() and "add_prefix_space" in json.loads(tokenizer_config.read_text()):
        writer.add_add_space_prefix(bool(json.loads(tokenizer_config.read_text())["add_prefix_space"]))

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config["num_hidden_layers"])
    count = 0
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is no dict)
                if name.endswith("rotary_emb.inv_freq"):
                    continue
                if name == "lm_head.weight" and config.get("tie_word_embeddings"):
                    continue  # llama.cpp reads a missing `output` as tied to `token_embd`
                new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
                if new_name is None:
                    raise GgufError(f"{file}: no llama.cpp name for tensor {name!r}")
                data = f.get_tensor(name).to(torch.float32).numpy()
                if name.endswith("q_proj.weight"):
                    data = permute_rotary(data, n_head)
                elif name.endswith("k_proj.weight"):
                    data = permute_rotary(data, n_kv)
                # norms and other 1-D tensors stay float32, as llama.cpp expects them
                tensor_type = (
                    gguf.GGMLQuantizationType.F32
                    if data.ndim <= 1 or new_name.endswith("_norm.weight")
                    else qtype
                )
                if tensor_type == gguf.GGMLQuantizationType.Q8_0 and data.shape[-1] % 32:
                    tensor_type = gguf.GGMLQuantizationType.F16  # Q8_0 packs rows in blocks of 32
                writer.add_tensor(new_name, gguf.quants.quantize(data, tensor_type), raw_dtype=tensor_type)
                count += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return GgufInfo(str(out_file), gguf_type, count, pre, out_file.stat().st_size)
