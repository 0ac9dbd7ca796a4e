"""`grooves config show`: a run file as grooves reads it, every default written out with its doc."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from grooves.config import RunConfig, SftConfig

app = typer.Typer(no_args_is_help=True, help="Run files: see what a run will use.")


@app.command("show")
def show(
    run_file: str | None = typer.Argument(None, help="An RL or SFT run file (TOML); none: the defaults."),
    sft: bool = typer.Option(
        False, "--sft", help="Show `grooves sft`'s run file (auto for a file with `data`)."
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override a field: --set optim.lr=1e-4 (value parsed as TOML)."
    ),
) -> None:
    """Print the resolved run file: every field, set or default, under its one-line doc. The output
    is itself a run file that loads to the same config."""
    from grooves.config import ConfigError, parse_config, parse_overrides, parse_sft_config
    from grooves.config.base import read_run_file
    from grooves.config.show import annotated_toml

    where = run_file or "the defaults"
    try:
        data = read_run_file(run_file, parse_overrides(set_))
        config: RunConfig | SftConfig
        if sft or "data" in data:
            config = parse_sft_config(data)
        else:
            config = parse_config(data)
    except ConfigError as exc:
        for line in str(exc).splitlines():
            typer.echo(f"{where}: {line}", err=True)
        raise typer.Exit(2) from None
    typer.echo(annotated_toml(config), nl=False)
