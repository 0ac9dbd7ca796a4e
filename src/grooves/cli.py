"""The `grooves` command line: one sub-command group per concept.

Each concept's commands live beside its code (`grooves.<concept>.cli`) and are mounted here, so
this file stays a table of contents.
"""

from __future__ import annotations

import typer

from grooves.report import cli as report_cli

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Train small agent models with RL.")

# sub-command groups (one line each)
app.add_typer(report_cli.app)
from grooves.policy import cli as policy_cli  # noqa: E402
app.command("serve")(policy_cli.serve_command)
app.add_typer(policy_cli.models_app, name="models")
from grooves.judge import cli as judge_cli  # noqa: E402
app.add_typer(judge_cli.app, name="judge")
# end of sub-command groups


def main() -> None:
    app()


if __name__ == "__main__":
    main()
