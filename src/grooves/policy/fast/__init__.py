"""CPU speed paths of the transformers policy."""
