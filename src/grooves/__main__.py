"""`python -m grooves`: the `grooves` command, e.g. under torchrun (`torchrun --nproc-per-node 2 -m grooves train RUN.toml`)."""

from grooves.cli import main

if __name__ == "__main__":
    main()
