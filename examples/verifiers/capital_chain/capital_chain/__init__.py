"""capital-chain: a multi-turn verifiers environment written for grooves' tests and results."""

from capital_chain.taskset import CapitalChainEnv, CapitalChainTaskset

__all__ = ["CapitalChainEnv", "CapitalChainTaskset"]
