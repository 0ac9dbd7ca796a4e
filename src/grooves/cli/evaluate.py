"""`grooves eval TARGET`: score a base model, an adapter or a checkpoint on a task's held-out split.

The rollouts are in-run validation's (`grooves.training.evaluate.evaluate`): the same scenarios,
sampling settings and request seeds. Given a run folder or a checkpoint, the run's own settings are
the defaults (task, samples, scenarios, temperature, max tokens, seed, model settings) and the
checkpoint's step seeds the requests, so `grooves eval RUN` repeats the validation logged at that
step. The figures carry 95% intervals: Wilson's for the success rate, a bootstrap over scenarios
for the mean reward (`grooves.report.intervals`).

torch and transformers are imported inside the command, so `grooves --help` stays fast.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import typer

from grooves.models import DEFAULT_MODEL


def eval_command(
    target: str = typer.Argument(
        ...,
        help="A run folder (its latest checkpoint; --select picks another), a checkpoint folder, an "
        f"adapter folder, or a base model (a built-in alias such as {DEFAULT_MODEL}, a local folder, a hub id).",
    ),
    task: str | None = typer.Option(
        None,
        "--task",
        help="Task to evaluate on (built-in name or module:object, which is imported and run: "
        "trusted code only); default: the run's.",
    ),
    option: list[str] = typer.Option(
        [], "--option", help="A task option, key=value (value parsed as TOML); default: the run's options."
    ),
    split: str = typer.Option(
        "validation",
        "--split",
        help="The task's split: validation, test (held out from training and validation) or train.",
    ),
    samples: int | None = typer.Option(
        None,
        "--samples",
        "-k",
        min=1,
        help="Rollouts per scenario; default: the run's validation.samples, else 1.",
    ),
    scenarios: int | None = typer.Option(
        None,
        "--scenarios",
        min=1,
        help="First N scenarios of the split; default: the run's validation.scenarios, else all.",
    ),
    temperature: float | None = typer.Option(
        None, "--temperature", min=0.0, max=2.0, help="Default: the run's validation.temperature, else 0.7."
    ),
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", min=1, help="Per turn; default: the run's rollout.max_tokens, else 64."
    ),
    seed: int | None = typer.Option(
        None, "--seed", min=0, help="Request seeds; default: the run's seed, else 0."
    ),
    select: str = typer.Option(
        "latest", "--select", help="For a run folder: latest, best (by val/success_rate) or a step number."
    ),
    base: str | None = typer.Option(
        None, "--base", help="Base model of an adapter; default: the run's, else adapter_config.json's."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object (for scripts) instead of text."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Also write every rollout group here (JSONL, one group per line): a batch `grooves judge score` reads.",
    ),
) -> None:
    """Evaluate a model, adapter or checkpoint on a task: success and reward with 95% intervals.

    Exit codes: 0 done; 2 a target, task or option that cannot be used (one line naming it).
    """
    from grooves.config import ConfigError, parse_overrides

    if split not in ("validation", "test", "train"):
        _fail(f"--split {split!r}: use validation, test or train")
    try:
        plan = _plan(target, select, base)
        settings = _settings(
            plan, task, option, parse_overrides, samples, scenarios, temperature, max_tokens, seed
        )
        if not settings["task"].scenarios(split):  # before any weights load
            raise ValueError(f"--split {split}: task {settings['task_name']} has no {split} scenarios")
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    result, groups = asyncio.run(_run(plan, settings, split))
    if out is not None:
        from grooves.jsonl import write_models

        write_models(out, groups, append=False)
        typer.echo(
            f"wrote {out}: {len(groups)} groups, {sum(len(g.trajectories) for g in groups)} rollouts",
            err=True,
        )
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for line in _text(result):
            typer.echo(line)


def _fail(message: str) -> None:
    for line in message.splitlines():
        typer.echo(f"grooves eval: {line}", err=True)
    raise typer.Exit(2)


def _plan(target: str, select: str, base: str | None) -> dict[str, Any]:
    """What TARGET names: the adapter (None for a base model), its base model, the run's config
    (when the adapter sits in a run's checkpoint) and the checkpoint's step (seeds the requests)."""
    from grooves.adapters.export import adapter_base_model
    from grooves.adapters.registry import is_adapter_dir, resolve_adapter
    from grooves.config import load_config

    path = Path(target)
    is_model = not (
        is_adapter_dir(path) or is_adapter_dir(path / "adapter") or (path / "checkpoints").is_dir()
    )
    if is_model:
        return {"adapter": None, "base": base or target, "config": None, "step": 0}
    adapter = resolve_adapter(path, select)  # AdapterNotFound is a FileNotFoundError
    checkpoint = adapter.parent if adapter.name == "adapter" else None
    run_file = checkpoint / "config.toml" if checkpoint is not None else None
    config = load_config(run_file) if run_file is not None and run_file.is_file() else None
    step = 0
    if checkpoint is not None and (checkpoint / "state.json").is_file():
        step = int(json.loads((checkpoint / "state.json").read_text())["step"])
    base = base or (config.model.base_model if config is not None else None) or adapter_base_model(adapter)
    return {"adapter": adapter, "base": base, "config": config, "step": step}


def _settings(plan, task, option, parse_overrides, samples, scenarios, temperature, max_tokens, seed) -> dict:
    from grooves.config import RolloutConfig, ValidationConfig
    from grooves.tasks.mixture import build_task

    config = plan["config"]
    v = config.validation if config is not None else None
    sys.path.insert(0, str(Path.cwd()))  # a task module in the current folder imports, as with `python -m`
    options = parse_overrides(option)
    if task is not None:
        built = _load_task(task, options)
    elif config is not None:
        if options:
            config = config.model_copy(update={"task_options": {**config.task_options, **options}})
        built = build_task(config)  # the run's task, or its mixture; ConfigError names the field
    else:
        raise ValueError("--task: name the task to evaluate on (a run folder or checkpoint names its own)")
    return {
        "task": built,
        "task_name": task or (config.task if config is not None and not config.tasks else "mixture"),
        "samples": samples or (v.samples if v else ValidationConfig().samples),
        "scenarios": scenarios or (v.scenarios if v else None),
        "temperature": temperature
        if temperature is not None
        else (v.temperature if v else ValidationConfig().temperature),
        "max_tokens": max_tokens or (config.rollout.max_tokens if config else RolloutConfig().max_tokens),
        "seed": seed if seed is not None else (config.seed if config else 0),
        "concurrency": config.rollout.concurrency if config else RolloutConfig().concurrency,
    }


def _load_task(spec: str, options: dict):
    from grooves.tasks import TaskLoadError, load_task

    try:
        return load_task(spec, options)
    except TaskLoadError as exc:
        raise ValueError(f"--task: {str(exc).removeprefix('task ')}") from None


async def _run(plan: dict, settings: dict, split: str) -> tuple[dict[str, Any], list]:
    from grooves.policy.transformers import TransformersPolicy
    from grooves.rollouts.handle import ModelHandle
    from grooves.serve.app import create_app, inprocess_client
    from grooves.training.evaluate import evaluate, summarize
    from grooves.training.runlog import show_bars

    config = plan["config"]
    model = config.model if config is not None else None
    policy = TransformersPolicy(
        plan["base"],
        adapter_path=plan["adapter"],
        served_name="eval",
        seed=config.seed if config else 0,
        **(
            {
                "dtype": model.dtype,
                "device": model.device,
                "tool_format": model.tool_format,
                "fast": model.fast,
            }
            if model
            else {}
        ),
    )
    app = create_app(policy)
    client = inprocess_client(app)
    try:
        handle = ModelHandle(client, policy.served_name, max_tokens=settings["max_tokens"])
        # the validation seed of the run (`validate`: seed + 1), at the checkpoint's step
        metrics, groups = await evaluate(
            settings["task"],
            handle,
            split=split,
            scenarios=settings["scenarios"],
            samples=settings["samples"],
            temperature=settings["temperature"],
            seed=settings["seed"] + 1,
            step=plan["step"],
            concurrency=settings["concurrency"],
            progress=show_bars(True),
        )
    finally:
        await client.close()
        app.state.scheduler.close()
    return {
        "model": str(plan["base"]),
        "adapter": str(plan["adapter"]) if plan["adapter"] else None,
        "step": plan["step"],
        "task": settings["task_name"],
        "split": split,
        "samples": settings["samples"],
        "temperature": settings["temperature"],
        "max_tokens": settings["max_tokens"],
        "seed": settings["seed"],
        **summarize(groups, seed=settings["seed"]),
    }, groups


def _text(r: dict[str, Any]) -> list[str]:
    what = f"{r['adapter']} on {r['model']}" if r["adapter"] else r["model"]
    lines = [
        f"{r['task']} {r['split']}: {r['scenarios']} scenarios x {r['samples']} samples = {r['rollouts']} rollouts "
        f"({r['failed']} failed), {what}, temperature {r['temperature']}"
    ]
    s, w = r["success"], r["reward"]
    if s is None:
        lines.append('success  not set by the task (traj.metrics["success"])')
    else:
        lines.append(f"success  {s['mean']:.3f}  95% interval {s['low']:.3f}-{s['high']:.3f} (Wilson)")
    if w is not None:
        lines.append(
            f"reward   {w['mean']:.3f}  95% interval {w['low']:.3f}-{w['high']:.3f} (bootstrap over scenarios)"
        )
    return lines
