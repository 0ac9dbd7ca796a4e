"""The README and the docs hold together: every relative link and image resolves (file and heading),
user docs carry no change-by-change history, and the README's own task trains as printed."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from grooves.cli import app

ROOT = Path(__file__).resolve().parents[1]
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
"""What a user reads: the README and docs/. History lives in CHANGELOG.md and benchmarks/results/."""
LINKED = [*USER_DOCS, ROOT / "CHANGELOG.md", ROOT / "benchmarks" / "results" / "README.md"]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where a link is a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())  # a link's text only
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if not match:
            continue
        base = slug(match.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file, _, fragment = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        where = f"{path.relative_to(ROOT)}: ({target})"
        if not dest.exists():
            broken.append(f"{where}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif fragment and (dest.is_dir() or dest.suffix != ".md" or fragment not in anchors(dest)):
            broken.append(f"{where}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    return broken


def test_the_slugs_are_githubs():
    assert slug("Environments: base, SFT, SFT + RL") == "environments-base-sft-sft--rl"
    assert slug("Supervised fine-tuning: `grooves sft` and the `[sft]` stage") == (
        "supervised-fine-tuning-grooves-sft-and-the-sft-stage"
    )
    assert slug("The sampler's memory on long chats") == "the-samplers-memory-on-long-chats"


def test_a_broken_link_a_missing_image_and_a_wrong_heading_are_each_found(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "there.md").write_text("# There\n\n## A section: `x` here\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md#a-section-x-here) [gone](missing.md) ![img](img/none.png) "
        "[bad](there.md#nowhere) [self](#top) `[code](ignored.md)`\n\n# Top\n\n"
        "```\n[in a block](also_ignored.md)\n```\n[web](https://example.com/x)\n"
    )
    assert broken_links(page) == [
        "page.md: (missing.md): no missing.md",
        "page.md: (img/none.png): no img/none.png",
        "page.md: (there.md#nowhere): no heading #nowhere in there.md",
    ]


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(path):
    assert broken_links(path) == []


@pytest.mark.parametrize("path", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_docs_state_the_present_not_the_history_of_changes(path):
    """'change 18' narratives belong in CHANGELOG.md; the docs say what is, with its command."""
    assert re.findall(r"\bchanges? \d+", path.read_text(), flags=re.I) == []


# ---- the README's "Train your own task" ---------------------------------------------------------------
def readme_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.S | re.M)


def readme_task() -> tuple[str, str]:
    """The task module and its run file, as the README prints them."""
    (module,) = [b for b in readme_blocks("python") if "async def rollout" in b]
    (run_file,) = [b for b in readme_blocks("toml") if "task = " in b]
    return module, run_file


def test_the_readmes_python_imports_grooves_only_through_its_public_face():
    imported = set()
    for block in readme_blocks("python"):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom):
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
    assert {m for m in imported if m.split(".")[0] == "grooves"} == {"grooves"}


def test_the_readmes_run_file_loads_as_printed():
    from grooves.config import parse_config

    _, run_file = readme_task()
    config = parse_config(tomllib.loads(run_file))
    assert (config.task, config.output_dir, config.rollout.group_size) == ("spell:Spell", "runs/spell", 8)


def test_the_readmes_task_trains_as_printed(peaked_model_dir, tmp_path, monkeypatch):
    """The README's two files, saved side by side, trained by `grooves train run.toml` on a tiny model:
    only the model, the run's size and the folder are overridden on the command line."""
    module, run_file = readme_task()
    project = tmp_path / "project"
    project.mkdir()
    (project / "spell.py").write_text(module)
    (project / "run.toml").write_text(run_file)
    monkeypatch.chdir(project)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))  # the command puts project/ on it
    monkeypatch.delitem(__import__("sys").modules, "spell", raising=False)
    overrides = {
        "model.base_model": str(peaked_model_dir),
        "steps": "2",
        "rollout.group_size": "2",
        "rollout.groups_per_step": "2",
        "rollout.max_tokens": "3",
        "validation.scenarios": "2",
        "logging.progress": "false",
    }
    args = ["train", "run.toml"] + [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    run_dir = project / "runs" / "spell"
    assert (run_dir / "checkpoints" / "step_000002" / "adapter").is_dir()
    assert (run_dir / "report.html").is_file()
    from grooves.jsonl import read_jsonl

    rows = read_jsonl(run_dir / "metrics.jsonl")
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(0.0 <= r["success_rate"] <= 1.0 and r["rollouts"] == 4.0 for r in steps)
    assert "val/success_rate" in rows[0]  # validated before the first step, on the validation digits
    assert "sets no traj.metrics" not in result.output
