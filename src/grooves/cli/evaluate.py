"""`grooves eval TARGET`: score a base model, an adapter or a checkpoint on a task's held-out split.

The rollouts are in-run validation's (`grooves.training.evaluate.evaluate`): the same scenarios,
sampling settings and request seeds. Given a run folder or a checkpoint (of `grooves train` or of
`grooves sft`), the run's own settings are the defaults (task, samples, scenarios, temperature,
max tokens, seed, model settings) and the checkpoint's step seeds the requests, so
`grooves eval RUN` repeats the validation logged at that step. The figures carry 95% intervals:
Wilson's for the success rate, a bootstrap over scenarios for the mean reward
(`grooves.report.intervals`), and say how the rollouts used their tools and what each reward part
averaged. `--against OTHER` scores a second target on the same scenarios with the same request
seeds, and compares the two scenario by scenario; `--samples-out FILE` keeps every episode.

torch and transformers are imported inside the command, so `grooves --help` stays fast.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer

from grooves.jsonl import write_jsonl
from grooves.models import DEFAULT_MODEL


def eval_command(
    target: str = typer.Argument(
        ...,
        help="A run folder of grooves train or grooves sft (its latest checkpoint; --select picks another), "
        "a checkpoint folder, an adapter folder, or a base model (a built-in alias such as "
        f"{DEFAULT_MODEL}, a local folder, a hub id).",
    ),
    task: str | None = typer.Option(
        None,
        "--task",
        help="Task to evaluate on: a built-in name, env:ENVIRONMENT, or module:object (a task or an "
        "environment, imported from the working folder and run: trusted code only); default: the run's.",
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
        None,
        "--max-tokens",
        min=1,
        help="Per turn; default: the run's validation.max_tokens, else its rollout.max_tokens, else 64.",
    ),
    seed: int | None = typer.Option(
        None, "--seed", min=0, help="Request seeds; default: the run's seed, else 0."
    ),
    select: str = typer.Option(
        "latest",
        "--select",
        help="For a run folder: latest, best (by val/success_rate) or a step number (for --against too).",
    ),
    base: str | None = typer.Option(
        None, "--base", help="Base model of an adapter; default: the run's, else adapter_config.json's."
    ),
    against: str | None = typer.Option(
        None,
        "--against",
        help="A second target (run, checkpoint, adapter or base model) scored on the same scenarios with "
        "the same request seeds as TARGET, with TARGET's settings; prints both and TARGET - OTHER per scenario.",
    ),
    samples_out: Path | None = typer.Option(
        None,
        "--samples-out",
        help="Write every episode to this JSONL file: scenario, chat, tool calls, reward and its parts, "
        "success, error (each line names its target).",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object (for scripts) instead of text."
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Also write every rollout group of TARGET here (JSONL, one group per line): a batch `grooves judge score` reads.",
    ),
) -> None:
    """Evaluate a model, adapter or checkpoint on a task: success and reward with 95% intervals,
    tool calls and reward parts; --against compares two on the same requests.

    Exit codes: 0 done; 2 a target, task or option that cannot be used (one line naming it).
    """
    from grooves.config import ConfigError

    if split not in ("validation", "test", "train"):
        _fail(f"--split {split!r}: use validation, test or train")
    try:
        plan = _plan(target, select, base)
        other = _plan(against, select, None) if against is not None else None
        settings = _settings(plan, task, option, samples, scenarios, temperature, max_tokens, seed)
        if not settings["task"].scenarios(split):  # before any weights load
            raise ValueError(f"--split {split}: task {settings['task_name']} has no {split} scenarios")
        if samples_out is not None and samples_out.is_dir():
            raise ValueError(f"--samples-out {samples_out}: a folder; name a file")
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    result, groups = asyncio.run(_run(plan, settings, split, plan["step"]))
    records = _records(target, groups)
    if other is not None and against is not None:  # the same requests: TARGET's settings and step key
        result["against"], other_groups = asyncio.run(_run(other, settings, split, plan["step"]))
        result["paired"] = _paired(groups, other_groups, settings["seed"])
        records += _records(against, other_groups)
    if samples_out is not None:
        samples_out.parent.mkdir(parents=True, exist_ok=True)
        write_jsonl(samples_out, records)
        result["samples_out"] = str(samples_out)
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
    """What TARGET names: the adapter (None for a base model), its base model, the config of the run
    whose checkpoint holds it (`config` for grooves train, `sft` for grooves sft) and the
    checkpoint's step (seeds the requests)."""
    from grooves.adapters.export import adapter_base_model
    from grooves.adapters.registry import is_adapter_dir, resolve_adapter

    path = Path(target)
    is_model = not (
        is_adapter_dir(path) or is_adapter_dir(path / "adapter") or (path / "checkpoints").is_dir()
    )
    if is_model:
        return {"adapter": None, "base": base or target, "config": None, "sft": None, "step": 0}
    adapter = resolve_adapter(path, select)  # AdapterNotFound is a FileNotFoundError
    checkpoint = adapter.parent if adapter.name == "adapter" else None
    config, sft = _run_configs(checkpoint) if checkpoint is not None else (None, None)
    step = 0
    if checkpoint is not None and (checkpoint / "state.json").is_file():
        step = int(json.loads((checkpoint / "state.json").read_text())["step"])
    run = config or sft
    base = base or (run.model.base_model if run is not None else None) or adapter_base_model(adapter)
    return {"adapter": adapter, "base": base, "config": config, "sft": sft, "step": step}


def _run_configs(checkpoint: Path):
    """(RL config, SFT config) of the run a checkpoint belongs to, each None where it is not one.
    An SFT run file names its `data`; an RL run file never does. A `[sft]` stage's folder
    (`<run>/sft`) records no task: its RL run's config comes with it, for the task and settings."""
    from grooves.config import load_config, load_sft_config
    from grooves.config.base import read_run_file

    run_file = checkpoint / "config.toml"
    if not run_file.is_file():
        return None, None
    if "data" not in read_run_file(run_file):
        return load_config(run_file), None
    sft = load_sft_config(run_file)
    outer = checkpoint.parents[2] / "config.toml"  # <run>/sft/checkpoints/step_N -> <run>/config.toml
    if not sft.task and checkpoint.parents[1].name == "sft" and outer.is_file():
        return load_config(outer), sft
    return None, sft


def _settings(plan, task, option, samples, scenarios, temperature, max_tokens, seed) -> dict:
    from grooves.config import parse_overrides
    from grooves.tasks.mixture import build_task
    from grooves.usercode import add_working_folder

    config, sft = plan["config"], plan["sft"]
    add_working_folder()  # a task module in the working folder imports, as with `python -m`
    options = parse_overrides(option)
    if task is not None:
        built, name = _load_task(task, options), task
    elif config is not None:
        if options:
            config = config.model_copy(update={"task_options": {**config.task_options, **options}})
        built = build_task(config)  # the run's task, or its mixture; ConfigError names the field
        name = config.task if not config.tasks else "mixture"
    elif sft is not None and sft.task:
        built, name = _load_task(sft.task, {**sft.task_options, **options}), sft.task
    else:
        raise ValueError(
            "--task: name the task to evaluate on (a run folder or checkpoint names its own; this SFT run "
            "validated on none)"
            if sft is not None
            else "--task: name the task to evaluate on (a run folder or checkpoint names its own)"
        )
    defaults = _defaults(config, sft)
    return {
        "task": built,
        "task_name": name,
        "samples": samples or defaults["samples"],
        "scenarios": scenarios or defaults["scenarios"],
        "temperature": temperature if temperature is not None else defaults["temperature"],
        "max_tokens": max_tokens or defaults["max_tokens"],
        "seed": seed if seed is not None else defaults["seed"],
        "concurrency": defaults["concurrency"],
    }


def _defaults(config, sft) -> dict[str, Any]:
    """The settings a run validated with: an RL run's (validation turns of `validation.max_tokens`,
    else `rollout.max_tokens`), else an SFT run's, else the run-file defaults."""
    from grooves.config import RolloutConfig, ValidationConfig

    if config is not None:
        v = config.validation
        return {
            "samples": v.samples,
            "scenarios": v.scenarios,
            "temperature": v.temperature,
            "max_tokens": v.max_tokens or config.rollout.max_tokens,
            "seed": config.seed,
            "concurrency": config.rollout.concurrency,
        }
    if sft is not None:
        v = sft.validation
        return {
            "samples": v.samples,
            "scenarios": v.scenarios,
            "temperature": v.temperature,
            "max_tokens": v.max_tokens or RolloutConfig().max_tokens,
            "seed": sft.seed,
            "concurrency": 16,
        }
    return {
        "samples": ValidationConfig().samples,
        "scenarios": None,
        "temperature": ValidationConfig().temperature,
        "max_tokens": RolloutConfig().max_tokens,
        "seed": 0,
        "concurrency": RolloutConfig().concurrency,
    }


def _load_task(spec: str, options: dict):
    from grooves.tasks import TaskLoadError, load_task

    try:
        return load_task(spec, options)
    except TaskLoadError as exc:
        raise ValueError(f"--task: {str(exc).removeprefix('task ')}") from None


async def _run(plan: dict, settings: dict, split: str, step: int) -> tuple[dict[str, Any], list]:
    """TARGET's figures and rollout groups: `settings`' scenarios and sampling, requests seeded from
    (seed + 1, `step`), as the run's validation at that step."""
    from grooves.policy.transformers import TransformersPolicy
    from grooves.rollouts.handle import ModelHandle
    from grooves.serve.app import create_app, inprocess_client
    from grooves.training.cost import HEARTBEAT_S
    from grooves.training.evaluate import evaluate, summarize
    from grooves.training.runlog import show_bars

    run = plan["config"] or plan["sft"]
    model = run.model if run is not None else None
    policy = TransformersPolicy(
        plan["base"],
        adapter_path=plan["adapter"],
        served_name="eval",
        seed=run.seed if run else 0,
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
            step=step,
            concurrency=settings["concurrency"],
            progress=show_bars(True),
            heartbeat=None if show_bars(True) else HEARTBEAT_S,  # a log file: a line a minute
        )
    finally:
        await client.close()
        app.state.scheduler.close()
    return {
        "model": str(plan["base"]),
        "adapter": str(plan["adapter"]) if plan["adapter"] else None,
        "step": plan["step"],
        "request_step": step,
        "task": settings["task_name"],
        "split": split,
        "samples": settings["samples"],
        "temperature": settings["temperature"],
        "max_tokens": settings["max_tokens"],
        "seed": settings["seed"],
        "success_threshold": getattr(settings["task"], "success_threshold", None),
        **summarize(groups, seed=settings["seed"]),
    }, groups


def _records(target: str, groups: list) -> list[dict[str, Any]]:
    from grooves.training.evaluate import episode_record

    return [
        {"target": target, **episode_record(traj, group.scenario, g, k)}
        for g, group in enumerate(groups)
        for k, traj in enumerate(group.trajectories)
    ]


def _paired(a: list, b: list, seed: int) -> dict[str, Any]:
    """TARGET - OTHER per scenario (each scenario's mean over its finished rollouts), over the
    scenarios both finished a rollout of; success only when the task sets it."""
    from grooves.report.intervals import paired_difference
    from grooves.training.evaluate import sets_success

    both = [(x.ok, y.ok) for x, y in zip(a, b, strict=True) if x.ok and y.ok]

    def mean(trajs, value) -> float:
        return sum(value(t) for t in trajs) / len(trajs)

    def success(t) -> float:
        return t.metrics.get("success", 0.0)

    def reward(t) -> float:
        return t.reward

    out: dict[str, Any] = {"scenarios": len(both), "success": None, "reward": None}
    if not both:
        return out
    if sets_success(a) or sets_success(b):
        out["success"] = paired_difference(
            [mean(x, success) for x, _ in both], [mean(y, success) for _, y in both], seed=seed
        )
    out["reward"] = paired_difference(
        [mean(x, reward) for x, _ in both], [mean(y, reward) for _, y in both], seed=seed
    )
    return out


def _text(r: dict[str, Any]) -> list[str]:
    lines = _figures(r)
    other = r.get("against")
    if other is not None:
        what = f"{other['adapter']} on {other['model']}" if other["adapter"] else other["model"]
        lines += [f"against {what}, on the same requests:", *_figures(other)[1:]]
        p = r["paired"]
        lines.append(f"difference per scenario (target - against), over {p['scenarios']} scenarios:")
        for key in ("success", "reward"):
            d = p[key]
            if d is not None:
                lines.append(
                    f"{key:<8} {d['difference']:+.3f}  95% interval {d['low']:+.3f} to {d['high']:+.3f} "
                    f"(bootstrap over scenarios); better on {d['better']}, worse on {d['worse']}, the same on {d['same']}"
                )
    if r.get("samples_out"):
        lines.append(f"episodes written to {r['samples_out']}")
    return lines


def _figures(r: dict[str, Any]) -> list[str]:
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
        if r.get("success_threshold") is not None:
            lines.append(
                f"         a rollout succeeds at a grade >= {r['success_threshold']} (success_threshold)"
            )
    if w is not None:
        lines.append(
            f"reward   {w['mean']:.3f}  95% interval {w['low']:.3f}-{w['high']:.3f} (bootstrap over scenarios)"
        )
    if r.get("reward_parts"):
        lines.append("parts    " + "  ".join(f"{k} {v:.3f}" for k, v in r["reward_parts"].items()))
    calls, errors = r.get("tool_calls"), r.get("tool_errors")
    if calls and (
        calls["total"] or errors is not None
    ):  # a task with tools, or one whose rollouts called some
        failed = (
            f", {errors['fraction_of_calls']:.0%} of them errors"
            if errors is not None and calls["total"]
            else ""
        )
        lines.append(f"tools    {calls['per_rollout']:.2f} calls a rollout{failed}")
    return lines
