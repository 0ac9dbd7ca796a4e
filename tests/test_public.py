"""The public face: what `grooves` and `grooves.envs` export imports, the type checker sees the same
names, and the errors `train()` raises are among them.

Each package lists its names once (`name -> module`), and `__all__` and the import on first use
both read that list; these tests hold the static imports under `TYPE_CHECKING` (what a type
checker and an editor see) to it.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import grooves

PACKAGES = ["grooves", "grooves.envs"]


def static_imports(package: str) -> dict[str, str]:
    """Name -> module of each import under `if TYPE_CHECKING:` in the package's `__init__`."""
    tree = ast.parse(Path(importlib.import_module(package).__file__).read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module, ast.unparse(imp)
                for alias in imp.names:
                    assert alias.name not in found, f"{alias.name} is imported twice"
                    found[alias.asname or alias.name] = imp.module
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_imports(package):
    module = importlib.import_module(package)
    assert len(module.__all__) == len(set(module.__all__))
    assert dir(module) == module.__all__
    names: dict = {}
    exec(f"from {package} import *", names)  # as a user's star import reads __all__
    for name in module.__all__:
        assert names[name] is getattr(module, name), name
    with pytest.raises(AttributeError, match="has no attribute 'not_exported'"):
        module.not_exported  # noqa: B018


@pytest.mark.parametrize("package", PACKAGES)
def test_the_type_checker_sees_the_exported_names_from_where_they_are_defined(package):
    module = importlib.import_module(package)
    static = static_imports(package)
    assert sorted(static) == sorted(set(module.__all__) - {"__version__"})
    for name, source in static.items():
        assert getattr(importlib.import_module(source), name) is getattr(module, name), name


ERRORS = ["ConfigError", "RunFolderError", "CheckpointError", "RunInterrupted"]


def test_the_errors_train_raises_are_exported_and_are_the_classes_it_raises(tiny_model_dir, tmp_path):
    from grooves.tasks.toy import ToyTokensTask

    assert set(ERRORS) <= set(grooves.__all__)
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'task = "toy_tokens"\nsteps = 1\n[task_options]\nvocab_size = 487\nnum_scenarios = 4\n'
        "[logging]\nprogress = false\nreport = false\n"
    )

    def config(out: str, model: Path):
        return grooves.load_config(
            run_file, {"output_dir": str(tmp_path / out), "model": {"base_model": str(model)}}
        )

    with pytest.raises(grooves.ConfigError, match=r"^model.base_model: "):
        grooves.train(config("config", tmp_path / "no-model"))
    with pytest.raises(grooves.RunFolderError, match="--resume: no checkpoint in "):
        grooves.train(config("empty", tiny_model_dir), resume=True)
    (tmp_path / "damaged" / "checkpoints" / "step_000001").mkdir(parents=True)  # no state, no adapter
    with pytest.raises(grooves.CheckpointError, match="no intact checkpoint in "):
        grooves.train(config("damaged", tiny_model_dir), resume=True)

    class CtrlC(ToyTokensTask):
        def scenarios(self, split):
            raise KeyboardInterrupt  # as Ctrl-C while the run starts

    with pytest.raises(
        grooves.RunInterrupted, match="interrupted after step 0 of 1, before the first checkpoint"
    ):
        grooves.train(config("interrupted", tiny_model_dir), task=CtrlC(vocab_size=487, num_scenarios=4))
