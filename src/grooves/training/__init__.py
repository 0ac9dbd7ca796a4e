"""The training loop and what it writes: RL (`loop.run`, over `session`, `collect` and `recorder`)
and SFT (`sft.run_sft`), the data streams, optimizer steps, checkpoints and the run folder."""
