"""`python -m grooves.cli`: the `grooves` command."""

from grooves.cli import main

if __name__ == "__main__":
    main()
