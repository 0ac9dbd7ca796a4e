"""The training math and its data: trajectories, advantages, losses, token sequences, forwards.

Pure functions and plain records, no I/O beyond JSONL files of trajectories: everything here can
be checked by hand on a few tensors. Every other layer builds on it; it imports only `config`
and `jsonl` below it.
"""
