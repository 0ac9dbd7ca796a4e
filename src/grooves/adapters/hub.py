"""`grooves export --push-to-hub REPO`: an export folder as a Hugging Face Hub model repository.

What is uploaded is laid out the way the Hub's tools expect a model repo: the merged model's
files at the root (so `AutoModelForCausalLM.from_pretrained(REPO)` and `vllm serve REPO` work),
the peft adapter under `adapter/` (`PeftModel.from_pretrained(base, REPO, subfolder="adapter")`),
`model.gguf` at the root when one was written (llama.cpp loads it from the Hub by repo and file
name), `export.json`, and a model card, `README.md`. `hub_files` lists exactly what would go up,
so it can be checked without a network.

The model card says what the model is: its base by Hub id and weights sha256 (with what the
embedded default's base is: the dequantized Q4_1 GGUF), the run's resolved config as saved with the
checkpoint, its validation figures from `metrics.jsonl` (each validated step's success rate and
mean reward), and the export's own logit checks. Its YAML header names `base_model`,
`library_name` and tags, which the Hub reads.

Uploading goes through `huggingface_hub` (`create_repo`, then one `create_commit` of every file):
the token is the usual one (`HF_TOKEN`, or `hf auth login`), and `HF_ENDPOINT` points it at another
Hub (the tests use a fake one on loopback).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from grooves.jsonl import read_jsonl

VALIDATION_KEYS = ("val/success_rate", "val/reward_mean")


def run_of(adapter_source: str | Path) -> tuple[Path | None, Path | None]:
    """(checkpoint folder, run folder) of an adapter that sits in a run (`RUN/checkpoints/step_N/adapter`)."""
    adapter = Path(adapter_source)
    checkpoint = (
        adapter.parent if adapter.name == "adapter" and (adapter.parent / "state.json").is_file() else None
    )
    run = checkpoint.parent.parent if checkpoint and checkpoint.parent.name == "checkpoints" else None
    return checkpoint, run


def validation_rows(run_dir: Path | None) -> list[dict[str, Any]]:
    """Each validated step of a run: its step and validation figures (`VALIDATION_KEYS`)."""
    path = run_dir / "metrics.jsonl" if run_dir else None
    if path is None or not path.is_file():
        return []
    rows = []
    for row in read_jsonl(path):
        figures = {k: row[k] for k in VALIDATION_KEYS if isinstance(row.get(k), int | float)}
        if figures:
            rows.append({"step": row.get("step"), **figures})
    return rows


def model_card(export_dir: str | Path, repo_id: str) -> str:
    """The README.md of the Hub repository for the export in `export_dir`."""
    export_dir = Path(export_dir)
    info = json.loads((export_dir / "export.json").read_text())
    base = info.get("base") or {}
    checkpoint, run = run_of(info["adapter_source"])
    has_merged = (export_dir / "merged").is_dir()
    tags = ["grooves", "lora", "reinforcement-learning", "grpo"] + (["gguf"] if info.get("gguf") else [])
    header = ["---"]
    if base.get("hub_id"):
        header.append(f"base_model: {base['hub_id']}")
    header.append(f"library_name: {'transformers' if has_merged else 'peft'}")
    header.append("tags:")
    header += [f"- {t}" for t in tags]
    header.append("---")
    lines = [*header, "", f"# {repo_id.split('/')[-1]}", ""]
    lines.append(
        "A LoRA adapter trained with grooves (GRPO-family reinforcement learning on agent tasks), "
        + ("merged into its base model." if has_merged else "as a peft adapter.")
    )
    lines += ["", "## Files", ""]
    if has_merged:
        lines.append(
            f"- the merged model ({info['dtype']}) at the root: `AutoModelForCausalLM.from_pretrained({repo_id!r})`"
        )
    if (export_dir / "adapter").is_dir():
        lines.append(
            f"- `adapter/`: the adapter alone (peft): `PeftModel.from_pretrained(base, {repo_id!r}, subfolder='adapter')`"
        )
    if info.get("gguf"):
        lines.append(f"- `model.gguf`: the merged model for llama.cpp ({info['gguf']['gguf_type']})")
    lines += ["", "## Base model", ""]
    lines.append(f"- Hub id: `{base.get('hub_id') or 'unknown'}`")
    lines.append(f"- weights sha256 (safetensors bytes): `{base.get('weights_sha256') or 'unknown'}`")
    if base.get("hub_id") == "HuggingFaceTB/SmolLM2-135M-Instruct":
        lines.append(
            "- trained on grooves' embedded default: the Q4_1 GGUF of this model, dequantized; the "
            "published bf16 weights differ from it, and the logit difference between the two is not measured"
        )
    lines += ["", "## Validation", ""]
    rows = validation_rows(run)
    if rows:
        lines.append("| step | " + " | ".join(VALIDATION_KEYS) + " |")
        lines.append("|---|" + "---|" * len(VALIDATION_KEYS))
        for row in rows:
            cells = [f"{row[k]:.4g}" if k in row else "" for k in VALIDATION_KEYS]
            lines.append(f"| {row['step']} | " + " | ".join(cells) + " |")
        if checkpoint is not None:
            step = json.loads((checkpoint / "state.json").read_text()).get("step")
            lines += ["", f"Exported: the checkpoint of step {step}."]
    else:
        lines.append(
            "No validation figures: the adapter was not exported from a run folder with metrics.jsonl."
        )
    lines += ["", "## Export checks", ""]
    if info.get("max_abs_logit_diff") is not None:
        lines.append(
            f"- max |logit(merged) - logit(adapter)| on a probe chat: {info['max_abs_logit_diff']:.3g}"
        )
    if info.get("gguf_max_abs_logit_diff") is not None:
        lines.append(
            f"- max |logit(gguf) - logit(merged)| on a probe chat: {info['gguf_max_abs_logit_diff']:.3g}"
        )
    config = checkpoint / "config.toml" if checkpoint else None
    if config is not None and config.is_file():
        lines += ["", "## Training config", "", "The run file as the trainer resolved it:", "", "```toml"]
        lines += [config.read_text().rstrip(), "```"]
    return "\n".join(lines) + "\n"


def hub_files(export_dir: str | Path) -> list[tuple[Path, str]]:
    """(local file, path in the repository) for everything `push_to_hub` uploads, in upload order."""
    export_dir = Path(export_dir)
    files: list[tuple[Path, str]] = []
    merged, adapter = export_dir / "merged", export_dir / "adapter"
    if merged.is_dir():
        files += [(p, p.relative_to(merged).as_posix()) for p in sorted(merged.rglob("*")) if p.is_file()]
    if adapter.is_dir():
        files += [
            (p, "adapter/" + p.relative_to(adapter).as_posix())
            for p in sorted(adapter.rglob("*"))
            if p.is_file()
        ]
    for name in ("model.gguf", "export.json", "README.md"):
        if (export_dir / name).is_file():
            files.append((export_dir / name, name))
    return files


def push_to_hub(
    export_dir: str | Path,
    repo_id: str,
    *,
    private: bool | None = None,
    token: str | None = None,
    commit_message: str | None = None,
) -> str:
    """Write the model card into `export_dir`, create `repo_id` if needed and upload `hub_files` in
    one commit; returns the commit's URL. `HF_ENDPOINT` (read now, not at import) picks the Hub."""
    from huggingface_hub import CommitOperationAdd, HfApi

    export_dir = Path(export_dir)
    (export_dir / "README.md").write_text(model_card(export_dir, repo_id))
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    operations = [
        CommitOperationAdd(path_in_repo=dest, path_or_fileobj=str(src)) for src, dest in hub_files(export_dir)
    ]
    info = api.create_commit(
        repo_id, operations, commit_message=commit_message or f"grooves export of {export_dir.name}"
    )
    return str(info.commit_url)
