"""The `grooves` command line: one sub-command group per concept.

Each concept's commands live beside its code (`grooves.<concept>.cli`) and are mounted here, so
this file stays a table of contents.
"""

from __future__ import annotations

import os
import shlex

# Idle OpenMP threads that spin stall torch badly when other processes share the cores (a
# sampling call measured 59-118 s spinning vs 4-7 s passive on a busy 2-core machine). It is
# read when torch loads, so it is set before any import that loads torch; export it to override.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer  # noqa: E402

from grooves.cli import adapters as adapters_cli  # noqa: E402
from grooves.cli import envs as env_cli  # noqa: E402
from grooves.cli import judge as judge_cli  # noqa: E402
from grooves.cli import policy as policy_cli  # noqa: E402
from grooves.cli import report as report_cli  # noqa: E402

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
    resume: bool = typer.Option(False, "--resume", help="Continue from the run folder's last intact checkpoint."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Delete the run already in the run folder and start afresh."),
    set_: list[str] = typer.Option([], "--set", help="Override a field: --set optim.lr=1e-4 (value parsed as TOML)."),
) -> None:
    """Train an adapter with RL as the run file describes.

    Exit codes: 0 done; 2 a run-file error or a run folder that cannot be used (one line each,
    naming the field or the folder); 1 a checkpoint or model that cannot be loaded; 130 Ctrl-C
    (one line: where the run stopped and the command that continues it).
    """
    from grooves.config import ConfigError, load_config, parse_overrides

    try:
        config = load_config(run_file, parse_overrides(set_))
    except ConfigError as exc:
        _fail_lines(run_file, exc, 2)
    from grooves.models import ModelError
    from grooves.train.checkpoint import CheckpointError
    from grooves.train.loop import NonFiniteStep, RunInterrupted, train
    from grooves.train.runlog import RunFolderError

    try:
        run_dir = train(config, resume=resume, overwrite=overwrite)
    except ConfigError as exc:
        _fail_lines(run_file, exc, 2)
    except RunFolderError as exc:
        _fail_lines(run_file, exc, 2)
    except (CheckpointError, ModelError, NonFiniteStep) as exc:
        _fail_lines(run_file, exc, 1)
    except RunInterrupted as exc:
        again = ["grooves", "train", run_file, *[a for item in set_ for a in ("--set", item)]]
        if exc.checkpoint_step is None:  # nothing to continue: a new start replaces the partial run
            typer.echo(f"{exc}; start again with: {shlex.join(again)}", err=True)
        else:
            typer.echo(f"{exc}; continue with: {shlex.join([*again, '--resume'])}", err=True)
        raise typer.Exit(130) from None
    typer.echo(f"run folder: {run_dir}")


def _fail_lines(run_file: str, exc: Exception, code: int) -> None:
    for line in str(exc).splitlines():
        typer.echo(f"{run_file}: {line}", err=True)
    raise typer.Exit(code)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
