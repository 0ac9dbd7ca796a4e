"""`grooves train` (RL from a run file) and `grooves sft` (supervised fine-tuning on example chats).

torch and transformers are imported inside the commands, so `grooves --help` stays fast.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import typer
from rich.console import Console

console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def train_command(
    run_file: str = typer.Argument(..., help="The run's TOML file."),
    resume: bool = typer.Option(
        False, "--resume", help="Continue from the run folder's last intact checkpoint."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Delete the run already in the run folder and start afresh."
    ),
    set_: list[str] = typer.Option(
        [], "--set", help="Override a field: --set optim.lr=1e-4 (value parsed as TOML)."
    ),
) -> None:
    """Train an adapter with RL as the run file describes.

    Exit codes: 0 done; 2 a run-file error or a run folder that cannot be used (one line each,
    naming the field or the folder); 1 a checkpoint or model that cannot be loaded, or a checkpoint
    that cannot be written (a full disk); 130 Ctrl-C
    (one line: where the run stopped and the command that continues it).
    """
    from grooves.config import ConfigError, load_config, parse_overrides

    try:
        config = load_config(run_file, parse_overrides(set_))
    except ConfigError as exc:
        _fail_lines(run_file, exc, 2)
    from grooves.tasks import add_task_folder

    add_task_folder(Path(run_file).parent)  # `task = "mytask:Task"` finds mytask.py beside the run file
    from grooves.models import ModelError
    from grooves.training.checkpoint import CheckpointError
    from grooves.training.loop import RunInterrupted, train
    from grooves.training.runlog import RunFolderError
    from grooves.training.step import NonFiniteStep

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


def sft_command(
    run_file: Path | None = typer.Argument(None, help="An SFT run file (TOML); or give --data and options."),
    data: str | None = typer.Option(None, "--data", help='JSONL of chats ({"messages": [...]} per line).'),
    model: str | None = typer.Option(None, "--model", help="Base model (default smollm2-135m)."),
    output_dir: str | None = typer.Option(None, "--output-dir", "-o", help="Run folder."),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Optimizer steps (default: one epoch)."),
    lr: float | None = typer.Option(None, "--lr", help="Learning rate."),
    set_: list[str] = typer.Option(
        [], "--set", help="Override a field: --set batch_size=16 (value parsed as TOML)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from the run folder's last checkpoint."),
) -> None:
    """Supervised fine-tuning of a LoRA adapter on example chats (loss on assistant tokens only)."""
    from grooves.config import ConfigError, load_sft_config, parse_overrides
    from grooves.training.checkpoint import CheckpointError
    from grooves.training.sft import ChatError, sft

    try:
        overrides = parse_overrides(set_)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--set") from None
    named = {
        "data": data,
        "model.base_model": model,
        "output_dir": output_dir,
        "steps": steps,
        "optim.lr": lr,
    }
    overrides.update({k: v for k, v in named.items() if v is not None})
    try:
        config = load_sft_config(run_file, overrides)
    except ConfigError as exc:
        raise _fail(f"in {run_file or 'the options'}:\n{exc}", code=2) from None
    if run_file is not None:
        from grooves.tasks import add_task_folder

        add_task_folder(run_file.parent)  # a validation task module beside the run file imports
    try:
        run_dir = sft(config, resume=resume)
    except (ChatError, ConfigError, FileNotFoundError) as exc:
        raise _fail(str(exc), code=2) from exc
    except CheckpointError as exc:  # one that cannot be loaded or written (a full disk)
        raise _fail(str(exc), code=1) from None
    console.print(f"run folder: {run_dir}", highlight=False)


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code=code)
