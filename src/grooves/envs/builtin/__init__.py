"""The built-in environments, one `TaskSpec` per module (`grooves.envs.get_env` builds them by name)."""
