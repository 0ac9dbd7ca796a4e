"""The built-in environments, one `EnvSpec` per module (`grooves.envs.get_env` builds them by name)."""
