"""The `grooves` command line: one module of commands per concept, mounted here.

The CLI is the top layer: it may import every package, and nothing imports it. Each module
imports torch and transformers only inside the commands that need them, so `grooves --help`
stays fast; this file stays a table of contents.
"""

from __future__ import annotations

import os

# Idle OpenMP threads that spin stall torch badly when other processes share the cores (see
# docs/serving.md). It is read when torch loads, so it is set before any import that loads
# torch; export it to override.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer  # noqa: E402

from grooves.cli import adapters, config, envs, evaluate, judge, models, report, rubric, serve, train  # noqa: E402

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Train small agent models with RL.")

# serving, models, adapters, training
app.command("serve")(serve.serve_command)
app.add_typer(models.models_app, name="models")
app.command("export")(adapters.export_command)
app.command("sft")(train.sft_command)
app.add_typer(adapters.weights_app, name="weights")
app.add_typer(adapters.adapters_app, name="adapters")
# judging, environments, reports
app.add_typer(judge.app, name="judge")
app.add_typer(rubric.app, name="rubric")
app.add_typer(envs.app, name="env")
app.add_typer(report.app)
app.command("train")(train.train_command)
app.command("eval")(evaluate.eval_command)
app.add_typer(config.app, name="config")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
