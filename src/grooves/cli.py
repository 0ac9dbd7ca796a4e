"""The `grooves` command line: one sub-command group per concept.

Each concept's commands live beside its code (`grooves.<concept>.cli`) and are mounted here, so
this file stays a table of contents.
"""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Train small agent models with RL.")

# sub-command groups (one line each)
# end of sub-command groups


def main() -> None:
    app()


if __name__ == "__main__":
    main()
