"""Running the user's agent: the model handle a rollout talks through, and groups of rollouts.

`ModelHandle` (in `handle`) is what a rollout function receives as `model`: an OpenAI client plus
the run's sampling settings and per-request seeds. `gather` (in `gather`) runs `group_size`
rollouts of many scenarios concurrently and records a rollout that raises as a failed trajectory.
Both talk to a server over HTTP (or the in-process app); neither holds a model.
"""

from grooves.rollouts.gather import RolloutFn, TooManyFailures, check_failures, gather
from grooves.rollouts.handle import ModelHandle

__all__ = ["ModelHandle", "RolloutFn", "TooManyFailures", "check_failures", "gather"]
