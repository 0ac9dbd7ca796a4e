"""Commands for adapters after (or beside) training: export, weights diff, list, promote.

    grooves export SOURCE --out DIR          merged Hugging Face model + peft adapter
    grooves weights diff A [B]               per-layer ||dW|| / ||W|| of one or two adapters
    grooves adapters list RUN_DIR            a run's checkpoints and their validation metrics
    grooves adapters promote NAME SOURCE     make a running server answer NAME with SOURCE
    grooves adapters rollback NAME           undo the last promotion of NAME
    grooves adapters watch RUN_DIR --name N  promote each new best checkpoint of a run (continual)

SOURCE is an adapter folder, a checkpoint folder, or a run folder (with `--select latest|best|STEP`).
torch and transformers are imported inside the commands, so `grooves --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from grooves.adapters.registry import (
    DEFAULT_METRIC,
    AdapterNotFound,
    AdapterRegistry,
    check_adapter_finite,
    resolve_adapter,
)

console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

adapters_app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="A run's adapters; promote one into a running server."
)
weights_app = typer.Typer(no_args_is_help=True, add_completion=False, help="Inspect adapter weights.")

SELECT_HELP = "For a run folder: latest, best (by --metric), or a step number."


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code=code)


def _resolve(source: str, select: str, metric: str, mode: str) -> Path:
    try:
        return resolve_adapter(source, select, metric, mode)  # type: ignore[arg-type]
    except (AdapterNotFound, ValueError) as exc:
        raise _fail(str(exc)) from exc


def parse_adapter_options(values: list[str], served_name: str) -> tuple[Path | None, list[tuple[str, Path]]]:
    """`grooves serve --adapter` values: at most one bare PATH (the model's own adapter), any NAME=PATH."""
    own: Path | None = None
    named: list[tuple[str, Path]] = []
    for value in values:
        name, sep, source = value.partition("=")
        if not sep:
            if own is not None:
                raise ValueError(
                    f"--adapter {value}: only one adapter can be unnamed; name the others NAME=PATH"
                )
            own = _resolve_option(value, value)
            continue
        if not name or not source:
            raise ValueError(f"--adapter {value!r}: expected NAME=PATH")
        if name == served_name or name in dict(named):
            raise ValueError(f"--adapter {value}: the name {name!r} is already served; pick another")
        named.append((name, _resolve_option(value, source)))
    return own, named


def _resolve_option(value: str, source: str) -> Path:
    try:
        path = resolve_adapter(source)
        check_adapter_finite(path)
    except (AdapterNotFound, ValueError) as exc:  # BadAdapter included
        raise ValueError(f"--adapter {value}: {exc}") from exc
    return path


def export_command(
    source: str = typer.Argument(..., help="Adapter folder, checkpoint folder, or run folder."),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Output folder: merged/ (Hugging Face model) and adapter/ (peft)."
    ),
    select: str = typer.Option("latest", "--select", help=SELECT_HELP),
    metric: str = typer.Option(DEFAULT_METRIC, "--metric", help="Validation metric for --select best."),
    mode: str = typer.Option("max", "--mode", help="max or min: which way --metric is better."),
    base: str | None = typer.Option(
        None, "--base", help="Base model; default: the one recorded in adapter_config.json."
    ),
    dtype: str = typer.Option(
        "float32", "--dtype", help="Dtype of the merged weights: float32, bfloat16 or float16."
    ),
    merged: bool = typer.Option(True, "--merged/--no-merged", help="Write the merged model."),
    adapter: bool = typer.Option(
        True, "--adapter/--no-adapter", help="Write the adapter alone (peft format)."
    ),
    verify: bool = typer.Option(
        True, "--verify/--no-verify", help="Reload the merged model and compare its logits."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out if it is not empty."),
) -> None:
    """Merge an adapter into its base model and write a plain Hugging Face folder (and the adapter).

    --out is written atomically (a temporary folder beside it, renamed when done) and must be
    empty or absent unless --overwrite. An adapter with NaN or inf weights is refused (exit 1).
    """
    from grooves.adapters.export import ExportError, export_adapter

    path = _resolve(source, select, metric, mode)
    try:
        result = export_adapter(
            path,
            out,
            base_model=base,
            dtype=dtype,
            merged=merged,
            adapter=adapter,
            verify=verify,
            overwrite=overwrite,
        )
    except ExportError as exc:
        raise _fail(str(exc)) from exc
    except (OSError, RuntimeError) as exc:  # the recorded base model is gone, or does not fit the adapter
        raise _fail(f"{exc}\nfix: pass the adapter's base model with --base") from exc
    console.print(f"adapter {path}", highlight=False)
    if result.merged_dir:
        console.print(f"merged model -> {result.merged_dir}", highlight=False)
    if result.adapter_dir:
        console.print(f"peft adapter -> {result.adapter_dir}", highlight=False)
    if result.max_abs_logit_diff is not None:
        console.print(
            f"max |logit(merged) - logit(adapter)| on the probe chat: {result.max_abs_logit_diff:.3g}",
            highlight=False,
        )


@weights_app.command("diff")
def weights_diff_command(
    a: str = typer.Argument(..., help="First adapter (adapter, checkpoint or run folder)."),
    b: str | None = typer.Argument(None, help="Second adapter to compare with (optional)."),
    select: str = typer.Option("latest", "--select", help=SELECT_HELP),
    group: str = typer.Option(
        "block", "--group", help="Rows: module (each weight), block (each layer), kind (q_proj...), total."
    ),
    base: str | None = typer.Option(
        None, "--base", help="Base model; default: the one in A's adapter_config.json."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Per-layer ||s B A||_F / ||W||_F: how far each adapter moves the base weights."""
    from dataclasses import asdict

    from grooves.adapters.drift import DriftError, drift_table

    if group not in ("module", "block", "kind", "total"):
        raise _fail(f"--group {group!r}: use module, block, kind or total", code=2)
    paths = [_resolve(s, select, DEFAULT_METRIC, "max") for s in ([a, b] if b else [a])]
    try:
        rows = drift_table(paths, base_model=base, group=group)  # type: ignore[arg-type]
        total = drift_table(paths, base_model=base, group="total")[0]
    except DriftError as exc:
        raise _fail(str(exc)) from exc
    if as_json:
        body = {
            "adapters": [str(p) for p in paths],
            "group": group,
            "rows": [asdict(r) for r in rows],
            "total": asdict(total),
        }
        typer.echo(json.dumps(body, indent=2))
        return
    caption = "rel X = ||dW_X|| / ||W|| (Frobenius); cos = <dW_A, dW_B> / (||dW_A|| ||dW_B||)"
    table = Table(group, "||W||", *[f"rel {chr(65 + i)}" for i in range(len(paths))], caption=caption)
    if len(paths) == 2:
        table.add_column("rel A-B")
        table.add_column("cos")
    for r in [*rows, total] if group != "total" else rows:
        cells = [r.name, f"{r.weight_norm:.3g}", *[f"{x:.3e}" for x in r.relative]]
        if r.relative_diff is not None:
            cells += [f"{r.relative_diff:.3e}", f"{r.cosine:+.3f}"]
        table.add_row(*cells)
    for i, p in enumerate(paths):
        console.print(f"{chr(65 + i)} = {p}", highlight=False)
    console.print(table)


@adapters_app.command("list")
def list_command(
    run_dir: Path = typer.Argument(..., help="A run folder (grooves train or grooves sft)."),
    metric: str = typer.Option(
        DEFAULT_METRIC, "--metric", help="Validation metric that picks the best checkpoint."
    ),
    mode: str = typer.Option("max", "--mode", help="max or min."),
) -> None:
    """A run's kept checkpoints, their validation metrics, and which is best."""
    try:
        registry = AdapterRegistry(run_dir)
        entries = registry.checkpoints()
    except AdapterNotFound as exc:
        raise _fail(str(exc)) from exc
    if not entries:
        raise _fail(f"{run_dir}: no complete checkpoints yet")
    try:
        best = registry.best(metric, mode).step  # type: ignore[arg-type]
    except AdapterNotFound:
        best = None
    val_keys = sorted({k for e in entries for k in e.metrics if k.startswith("val/")})
    table = Table("step", *val_keys, "best", "adapter", title=str(run_dir))
    for e in entries:
        vals = [f"{e.metrics[k]:.4g}" if isinstance(e.metrics.get(k), int | float) else "" for k in val_keys]
        table.add_row(
            str(e.step), *vals, "*" if e.step == best else "", str(e.adapter.relative_to(registry.run_dir))
        )
    console.print(table)
    if best is None:
        console.print(
            f"no kept checkpoint has {metric}; `--select best` will fail for this run", highlight=False
        )


@adapters_app.command("promote")
def promote_command(
    name: str = typer.Argument(..., help="Served model name whose adapter is replaced."),
    source: str = typer.Argument(
        ..., help="Adapter, checkpoint or run folder (resolved here, sent as an absolute path)."
    ),
    server: str = typer.Option(
        "http://127.0.0.1:8000/v1", "--server", help="Base URL of the running `grooves serve`."
    ),
    select: str = typer.Option("latest", "--select", help=SELECT_HELP),
    metric: str = typer.Option(DEFAULT_METRIC, "--metric", help="Validation metric for --select best."),
) -> None:
    """Atomically make NAME answer with SOURCE on a running server (requests in flight finish on the old one)."""
    from grooves.adapters.promote import http_promoter

    path = _resolve(source, select, metric, "max")
    try:
        body = http_promoter(server, name)(path)
    except (RuntimeError, OSError) as exc:
        raise _fail(str(exc)) from exc
    console.print(
        f"{name} -> {body['path']} ({body['adapter_id']}, version {body['version']})", highlight=False
    )


@adapters_app.command("rollback")
def rollback_command(
    name: str = typer.Argument(..., help="Served model name to roll back."),
    server: str = typer.Option(
        "http://127.0.0.1:8000/v1", "--server", help="Base URL of the running `grooves serve`."
    ),
) -> None:
    """Make NAME answer with what it served before its last promotion."""
    import httpx

    try:
        resp = httpx.post(f"{server.rstrip('/')}/adapters/{name}/rollback", timeout=120.0)
    except httpx.HTTPError as exc:
        raise _fail(f"{server}: {exc}") from exc
    if resp.status_code >= 400:
        raise _fail(resp.json().get("error", {}).get("message", resp.text))
    body = resp.json()
    console.print(
        f"{name} -> {body['path'] or 'the base weights'} (version {body['version']})", highlight=False
    )


@adapters_app.command("watch")
def watch_command(
    run_dir: Path = typer.Argument(..., help="A run folder that is training (or done)."),
    name: str = typer.Option(..., "--name", help="Served model name to keep promoting."),
    server: str = typer.Option(
        "http://127.0.0.1:8000/v1", "--server", help="Base URL of the running `grooves serve`."
    ),
    select: str = typer.Option("best", "--select", help="best (by --metric) or latest."),
    metric: str = typer.Option(DEFAULT_METRIC, "--metric", help="Validation metric for --select best."),
    mode: str = typer.Option("max", "--mode", help="max or min."),
    interval: float = typer.Option(
        30.0, "--interval", min=0.1, help="Seconds between looks at the run folder."
    ),
) -> None:
    """Continual promotion: promote each new best (or latest) checkpoint of a run as it appears. Ctrl-C stops."""
    from grooves.adapters.promote import http_promoter, watch_run

    if select not in ("best", "latest"):
        raise _fail(f"--select {select!r}: use best or latest", code=2)
    send = http_promoter(server, name)

    def promote(path: Path) -> None:
        body = send(path)
        console.print(f"promoted {path} -> {name} (version {body['version']})", highlight=False)

    try:
        watch_run(run_dir, promote, select=select, metric=metric, mode=mode, interval_s=interval)  # type: ignore[arg-type]
    except KeyboardInterrupt:
        pass
    except (RuntimeError, OSError) as exc:
        raise _fail(str(exc)) from exc
