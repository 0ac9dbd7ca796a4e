"""`grooves env ...`: list, inspect, validate, demonstrate and serve environments, built-in or your own.

Every command that takes an environment takes what `--task` takes: a built-in's name or
`module:object` (`envs.registry.load_env`), imported with the working folder on the import path.
A name that cannot be used is one line on stderr naming it and what is wrong (exit 2).
"""

from __future__ import annotations

import json

import typer

from grooves.envs.registry import BUILTINS, get_spec

ENV_HELP = (
    f"A built-in ({', '.join(BUILTINS)}) or your own as module:object: an EnvSpec, an Environment, or a "
    "function returning one (module.py in the working folder; it is imported and run: trusted code only)."
)

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Agent environments: list, validate, demonstrate, serve. Each takes a built-in's name or your "
    "own as module:object, e.g. `grooves env validate library_desk:SPEC` for SPEC in ./library_desk.py.",
)


def _load(command: str, name: str, seed: int):
    """The environment NAME names, or one line on stderr and exit 2."""
    from grooves.envs.registry import EnvLoadError, load_env
    from grooves.usercode import add_working_folder

    add_working_folder()
    try:
        return load_env(name, seed=seed)
    except EnvLoadError as exc:
        _fail(command, str(exc))


def _fail(command: str, message: str, code: int = 2):
    typer.echo(f"grooves env {command}: {message}", err=True)
    raise typer.Exit(code)


@app.command("list")
def list_envs() -> None:
    """The built-in environments and what each asks of an agent."""
    for name in BUILTINS:
        spec = get_spec(name)
        tools = ", ".join(t.name for t in spec.tools)
        typer.echo(f"{name}: {spec.description}\n  tools: {tools}")


@app.command("scenarios")
def scenarios(
    name: str = typer.Argument(..., help=ENV_HELP),
    split: str = typer.Option("validation", help="train, validation or test"),
    seed: int = typer.Option(0, help="data seed"),
    limit: int = typer.Option(5, help="how many to print"),
) -> None:
    """Print scenarios of a split as JSON lines (expected outcome included)."""
    env = _load("scenarios", name, seed)
    try:
        chosen = env.scenarios(split)[:limit]  # type: ignore[arg-type]
    except ValueError as exc:
        _fail("scenarios", f"--split: {exc}")
    for sc in chosen:
        typer.echo(json.dumps(sc, default=str))


@app.command("validate")
def validate(
    name: str = typer.Argument(..., help=ENV_HELP),
    seed: int = typer.Option(0, help="data seed"),
) -> None:
    """Prove the grader: the gold solver must score 1.0 on every scenario, and each known-bad solver
    at most 0.5 on every scenario. Prints a summary per solver and the first failures; exit 1 if any."""
    report = _load("validate", name, seed).validate()
    typer.echo(report.summary())
    for failure in report.failures[:20]:
        typer.echo(f"  {failure}")
    if len(report.failures) > 20:
        typer.echo(f"  ... and {len(report.failures) - 20} more")
    raise typer.Exit(0 if report.ok else 1)


@app.command("demos")
def demos(
    name: str = typer.Argument(..., help=ENV_HELP),
    out: str = typer.Option(..., "--out", help="JSONL file to write (one chat per line)"),
    split: str = typer.Option("train", help="train (validation and test scenarios are never demonstrated)"),
    seed: int = typer.Option(0, help="data seed"),
    copies: int = typer.Option(1, min=1, help="chats per scenario, each worded anew"),
    wording_seed: int = typer.Option(0, help="seeds the choice of wording"),
) -> None:
    """Play the gold solver on every scenario of the split and write the chats that score 1.0.
    Exit 1 when none does (nothing is written then)."""
    from grooves.envs.demos import write_demonstrations

    env = _load("demos", name, seed)
    if split != "train":
        raise typer.BadParameter(
            f"split {split!r}: demonstrations come from the train split only, so the validation and test "
            "scenarios stay unseen and measure what was learned",
            param_hint="--split",
        )
    try:
        report = write_demonstrations(env, out, split, seed=wording_seed, copies=copies)
    except ValueError as exc:
        _fail("demos", str(exc))
    if not report.scenarios:
        _fail("demos", f"{env.name} has no train scenarios to demonstrate", code=1)
    if not report.written:
        first = (report.dropped + report.skipped)[:1]
        _fail(
            "demos",
            f"{report.summary()}; wrote nothing{f' (first: {first[0]})' if first else ''}: "
            f"grooves env validate {name} shows what the gold solver misses",
            code=1,
        )
    typer.echo(f"{report.summary()}; wrote {out}")
    for line in (report.dropped + report.skipped)[:20]:
        typer.echo(f"  {line}")


@app.command("serve")
def serve(
    name: str = typer.Argument(..., help=ENV_HELP),
    host: str = typer.Option("127.0.0.1", help="interface to bind; 0.0.0.0 exposes it to the network"),
    port: int = typer.Option(8100, help="TCP port"),
    seed: int = typer.Option(0, help="data seed"),
    ttl: float = typer.Option(600.0, help="seconds an idle session lives before it is closed"),
    max_sessions: int = typer.Option(512, help="open sessions allowed at once"),
    max_body_bytes: int = typer.Option(32 * 2**20, min=1, help="largest request body (413 past it)"),
    max_snapshot_bytes: int = typer.Option(
        16 * 2**20, min=1, help="largest snapshot a session may restore (413 past it)"
    ),
    mcp: bool = typer.Option(
        False,
        "--mcp",
        help="serve it as an MCP server (Streamable HTTP at http://HOST:PORT/mcp), one episode per MCP session",
    ),
    stdio: bool = typer.Option(False, "--stdio", help="with --mcp: over stdin/stdout instead of HTTP"),
) -> None:
    """Serve an environment over HTTP (sessions: create, reset, step, snapshot, restore, grade, close),
    or with --mcp as an MCP server (its tools, and grooves_reset / grooves_grade to run episodes)."""
    if stdio and not mcp:
        raise typer.BadParameter("--stdio serves MCP over stdin/stdout; add --mcp", param_hint="--stdio")
    env = _load("serve", name, seed)
    if mcp:
        from grooves.envs.mcp_server import serve_http, serve_stdio

        if stdio:
            serve_stdio(env, ttl_s=ttl, max_sessions=max_sessions)
        else:
            serve_http(
                env, host=host, port=port, ttl_s=ttl, max_sessions=max_sessions, max_body_bytes=max_body_bytes
            )
        return
    from grooves.envs.server import serve as run

    run(
        env,
        host=host,
        port=port,
        ttl_s=ttl,
        max_sessions=max_sessions,
        max_body_bytes=max_body_bytes,
        max_snapshot_bytes=max_snapshot_bytes,
    )
