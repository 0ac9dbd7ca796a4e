"""pytest collects the docstring examples of every module in src/grooves (pyproject.toml). A module
that needs an optional engine is left out where that engine is not installed, as `import grooves`
never needs it: the Ray rollout runner imports Ray itself.

`--time-budget SECONDS` skips every test that would start after that many seconds of the run, each
with the reason: CI runs the heavy targets (`make test-slow`) for as long as its budget allows."""

import importlib.util
import time

import pytest

collect_ignore = [] if importlib.util.find_spec("ray") else ["src/grooves/scale/ray_rollouts.py"]

_STARTED = time.monotonic()


def pytest_addoption(parser):
    parser.addoption(
        "--time-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="skip the tests that would start after this many seconds of the run",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    budget = item.config.getoption("--time-budget")
    if budget is not None and time.monotonic() - _STARTED > budget:
        pytest.skip(f"the run's --time-budget of {budget:.0f} s was spent before this test")
