"""`grooves report RUN_DIR`: write the run's report.html and say where it is.

Heavy imports (matplotlib, the watch) happen inside the command, so `grooves --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(add_completion=False)


@app.command("report")
def report(
    run_dir: Path = typer.Argument(..., help="The run directory (holds metrics.jsonl)."),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Where to write the page; default RUN_DIR/report.html."
    ),
    rewatch: bool = typer.Option(
        False,
        "--rewatch",
        help="Recompute the findings by running the watch (the run's [watch] config) over metrics and samples, "
        "instead of reading findings.jsonl.",
    ),
    sample_steps: int = typer.Option(
        6, min=0, help="Most sample steps shown (first, last, and after findings)."
    ),
    best: int = typer.Option(3, min=0, help="Best outputs shown per sample step."),
    worst: int = typer.Option(3, min=0, help="Worst outputs shown per sample step."),
    random: int = typer.Option(4, min=0, help="Random outputs shown per sample step."),
) -> None:
    """One self-contained HTML page: reward curves per signal, the watch's findings on the timeline, samples, config."""
    from grooves.report.write import write_report

    try:
        _, summary = write_report(
            run_dir, out, rewatch=rewatch, sample_steps=sample_steps, picks=(best, worst, random)
        )
    except (FileNotFoundError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(summary)
