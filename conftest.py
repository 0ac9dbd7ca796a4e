"""pytest collects the docstring examples of every module in src/grooves (pyproject.toml). A module
that needs an optional engine is left out where that engine is not installed, as `import grooves`
never needs it: the Ray rollout runner imports Ray itself."""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("ray") else ["src/grooves/scale/ray_rollouts.py"]
