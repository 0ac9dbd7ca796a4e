"""grooves: train small open-weight agent models with GRPO-family RL on LoRA adapters.

The public surface is small on purpose: an agent talks to a policy through an OpenAI-style
client, rollouts become `Trajectory` objects grouped per scenario, and `train` turns scored
groups into a new adapter.
"""

__version__ = "0.1.0"

from grooves.core.gather import gather
from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup

__all__ = ["SampledTurn", "Trajectory", "TrajectoryGroup", "gather", "__version__"]
