"""The client side of the training service: train a model on `grooves serve --train` from your own loop.

`TrainableModel` (in `model`) samples through an OpenAI client, gathers rollouts as the trainer
does, and sends scored groups for one training step at a time; `wire` is what those requests
carry. It imports no torch: the loop's machine needs none of the training stack.
"""

from grooves.remote.model import ServiceError, StepResult, TrainableModel

__all__ = ["ServiceError", "StepResult", "TrainableModel"]
