"""The `grooves` command line: one sub-command group per concept.

Each concept's commands live beside its code (`grooves.<concept>.cli`) and are mounted here, so
this file stays a table of contents.
"""

from __future__ import annotations

import os

# Idle OpenMP threads that spin stall torch badly when other processes share the cores (a
# sampling call measured 59-118 s spinning vs 4-7 s passive on a busy 2-core machine). It is
# read when torch loads, so it is set before any import that loads torch; export it to override.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer  # noqa: E402

from grooves.adapters import cli as adapters_cli  # noqa: E402
from grooves.envs import cli as env_cli  # noqa: E402
from grooves.judge import cli as judge_cli  # noqa: E402
from grooves.policy import cli as policy_cli  # noqa: E402
from grooves.report import cli as report_cli  # noqa: E402

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Train small agent models with RL.")

# training (defined below), serving, adapters
app.command("serve")(policy_cli.serve_command)
app.add_typer(policy_cli.models_app, name="models")
app.command("export")(adapters_cli.export_command)
app.command("sft")(adapters_cli.sft_command)
app.add_typer(adapters_cli.weights_app, name="weights")
app.add_typer(adapters_cli.adapters_app, name="adapters")
# judging, environments, reports
app.add_typer(judge_cli.app, name="judge")
app.add_typer(env_cli.app, name="env")
app.add_typer(report_cli.app)


@app.command("train")
def train_command(
    run_file: str = typer.Argument(..., help="The run's TOML file."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the run folder's last checkpoint."),
    set_: list[str] = typer.Option([], "--set", help="Override a field: --set optim.lr=1e-4 (value parsed as TOML)."),
) -> None:
    """Train an adapter with RL as the run file describes."""
    from grooves.config import ConfigError, load_config, parse_overrides

    try:
        config = load_config(run_file, parse_overrides(set_))
    except ConfigError as exc:
        typer.echo(f"error in {run_file}:\n{exc}", err=True)
        raise typer.Exit(2) from None
    from grooves.trainer import train

    run_dir = train(config, resume=resume)
    typer.echo(f"run folder: {run_dir}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
