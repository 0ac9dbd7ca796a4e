"""The package's seams: no module of grooves imports another module's private name.

A leading underscore says "this module's own". Code that several modules share is a public name
of a module that says what it is (the request pipeline of the serving routes is
`serve.pipeline`), never `from grooves.x import _y` in another file. Every module is read with
`ast`, so an import inside a function, under `TYPE_CHECKING`, relative or across several lines
counts as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grooves

SRC = Path(grooves.__file__).resolve().parent


def module_of(path: Path, root: Path) -> list[str]:
    """The dotted name, as parts, of the module at `path` in the package at `root` (a package's
    `__init__` is the package itself)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_from(node: ast.ImportFrom, path: Path, root: Path) -> str:
    """The absolute name of the module an import takes its names from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    module = module_of(path, root)
    package = module if path.name == "__init__.py" else module[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private(name: str) -> bool:
    """A private name: a leading underscore, and not a dunder (`__version__`, `__future__`)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(root: Path) -> list[str]:
    """Each import in the package at `root` of a name another module keeps private, as
    `file:line: from module import name` (or `import name`), in file and line order."""
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent).as_posix()
        lines = []
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom):
                source = imported_from(node, path, root)
                lines += [
                    (node.lineno, f"from {source} import {a.name}") for a in node.names if private(a.name)
                ]
            elif isinstance(node, ast.Import):
                lines += [
                    (node.lineno, f"import {a.name}")
                    for a in node.names
                    if any(private(part) for part in a.name.split("."))
                ]
        found += [f"{where}:{line}: {statement}" for line, statement in sorted(lines)]
    return found


def test_no_module_imports_another_modules_private_name():
    found = private_imports(SRC)
    assert not found, "make the name public where it is shared:\n" + "\n".join(found)


def test_the_check_finds_a_private_name_however_it_is_imported(tmp_path):
    package = tmp_path / "grooves"
    (package / "serve").mkdir(parents=True)
    (package / "__init__.py").write_text("from __future__ import annotations\n__all__ = ['__version__']\n")
    (package / "serve" / "__init__.py").write_text("")
    (package / "serve" / "chat.py").write_text(
        "def _own():\n    pass\n\n\ndef shared():\n    return _own()\n"  # its own private name: fine
    )
    (package / "serve" / "routes.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from grooves.serve.chat import (\n    shared,\n    _own,\n)\n"
        "from .chat import _own as own\n"
        "from . import _hidden\n"
        "import grooves._private.thing\n"
        "if TYPE_CHECKING:\n    from ..serve.chat import _typed\n"
        "def later():\n    from grooves.serve.chat import _late\n"
    )
    assert private_imports(package) == [
        "grooves/serve/routes.py:2: from grooves.serve.chat import _own",
        "grooves/serve/routes.py:6: from grooves.serve.chat import _own",
        "grooves/serve/routes.py:7: from grooves.serve import _hidden",
        "grooves/serve/routes.py:8: import grooves._private.thing",
        "grooves/serve/routes.py:10: from grooves.serve.chat import _typed",
        "grooves/serve/routes.py:12: from grooves.serve.chat import _late",
    ]
