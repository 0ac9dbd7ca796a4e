"""Import paths users wrote before the layered layout still work: each old module re-exports the
objects that moved, the very same objects."""

from __future__ import annotations

import importlib

import pytest

MOVED = {
    "grooves.trajectory": ("grooves.core.trajectory", "grooves.core.gather"),
    "grooves.advantage": ("grooves.core.advantage",),
    "grooves.loss": ("grooves.core.loss",),
    "grooves.tokenize": ("grooves.core.tokenize",),
    "grooves.forward": ("grooves.core.forward",),
    "grooves.policy.handle": ("grooves.core.handle",),
    "grooves.trainer": (
        "grooves.train.loop",
        "grooves.train.step",
        "grooves.train.data",
        "grooves.train.checkpoint",
        "grooves.core.batching",
    ),
    "grooves.sft": ("grooves.train.sft", "grooves.config.sft"),
    "grooves.checkpoint": ("grooves.train.checkpoint",),
    "grooves.runlog": ("grooves.train.runlog",),
    "grooves.optim": ("grooves.train.optim",),
    "grooves.server": (
        "grooves.serve.app",
        "grooves.serve.chat",
        "grooves.serve.errors",
        "grooves.serve.schemas",
    ),
    "grooves.adapters.live": ("grooves.serve.routing",),
    "grooves.policy.transformers_policy": (
        "grooves.policy.transformers",
        "grooves.policy.prompts",
        "grooves.config",
    ),
    "grooves.policy.vllm_policy": ("grooves.policy.vllm",),
    "grooves.watch.config": ("grooves.config.watch",),
    "grooves.envs.task": ("grooves.envs.sqlite",),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_re_exports_what_moved(old):
    shim = importlib.import_module(old)
    assert shim.__doc__.startswith("Moved to ") and "kept for compatibility" in shim.__doc__
    assert shim.__all__, old
    homes = [importlib.import_module(m) for m in MOVED[old]]
    for name in shim.__all__:
        obj = getattr(shim, name)  # the same object, under its old name where it was renamed
        assert any(obj is value for home in homes for value in vars(home).values()), (old, name)


def test_the_documented_entry_points_are_the_new_objects():
    import grooves
    import grooves.config
    import grooves.envs
    import grooves.sft
    import grooves.trainer
    from grooves.core.trajectory import SampledTurn, Trajectory, TrajectoryGroup
    from grooves.train import loop, sft

    assert (grooves.Trajectory, grooves.TrajectoryGroup, grooves.SampledTurn) == (
        Trajectory,
        TrajectoryGroup,
        SampledTurn,
    )
    assert grooves.trainer.train is loop.train and grooves.trainer.run is loop.run
    assert grooves.sft.sft is sft.sft
    assert callable(grooves.config.load_config) and callable(grooves.envs.get_env)
