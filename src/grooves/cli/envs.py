"""`grooves env ...`: list, inspect, validate and serve the built-in environments."""

from __future__ import annotations

import json

import typer

from grooves.envs.registry import BUILTINS, get_env, get_spec

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Agent environments: list, validate, serve."
)


@app.command("list")
def list_envs() -> None:
    """The built-in environments and what each asks of an agent."""
    for name in BUILTINS:
        spec = get_spec(name)
        tools = ", ".join(t.name for t in spec.tools)
        typer.echo(f"{name}: {spec.description}\n  tools: {tools}")


@app.command("scenarios")
def scenarios(
    name: str = typer.Argument(..., help=f"one of {', '.join(BUILTINS)}"),
    split: str = typer.Option("validation", help="train, validation or test"),
    seed: int = typer.Option(0, help="data seed"),
    limit: int = typer.Option(5, help="how many to print"),
) -> None:
    """Print scenarios of a split as JSON lines (expected outcome included)."""
    env = get_env(name, seed=seed)
    for sc in env.scenarios(split)[:limit]:  # type: ignore[arg-type]
        typer.echo(json.dumps(sc))


@app.command("validate")
def validate(
    name: str = typer.Argument(..., help=f"one of {', '.join(BUILTINS)}"),
    seed: int = typer.Option(0, help="data seed"),
) -> None:
    """Prove the grader: gold solutions must score 1.0 and known-bad ones low. Exit 1 if not."""
    report = get_env(name, seed=seed).validate()
    typer.echo(report.summary())
    for failure in report.failures[:20]:
        typer.echo(f"  {failure}")
    raise typer.Exit(0 if report.ok else 1)


@app.command("demos")
def demos(
    name: str = typer.Argument(..., help=f"one of {', '.join(BUILTINS)}"),
    out: str = typer.Option(..., "--out", help="JSONL file to write (one chat per line)"),
    split: str = typer.Option("train", help="train (validation and test scenarios are never demonstrated)"),
    seed: int = typer.Option(0, help="data seed"),
    copies: int = typer.Option(1, min=1, help="chats per scenario, each worded anew"),
    wording_seed: int = typer.Option(0, help="seeds the choice of wording"),
) -> None:
    """Play the gold solver on every scenario of the split and write the chats that score 1.0."""
    from grooves.envs.demos import write_demonstrations

    try:
        report = write_demonstrations(get_env(name, seed=seed), out, split, seed=wording_seed, copies=copies)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--split") from None
    typer.echo(f"{report.summary()}; wrote {out}")
    for line in (report.dropped + report.skipped)[:20]:
        typer.echo(f"  {line}")


@app.command("serve")
def serve(
    name: str = typer.Argument(..., help=f"one of {', '.join(BUILTINS)}"),
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
    if mcp:
        from grooves.envs.mcp_server import serve_http, serve_stdio

        env = get_env(name, seed=seed)
        if stdio:
            serve_stdio(env, ttl_s=ttl, max_sessions=max_sessions)
        else:
            typer.echo(f"MCP server for {name} at http://{host}:{port}/mcp", err=True)
            serve_http(
                env, host=host, port=port, ttl_s=ttl, max_sessions=max_sessions, max_body_bytes=max_body_bytes
            )
        return
    from grooves.envs.server import serve as run

    run(
        get_env(name, seed=seed),
        host=host,
        port=port,
        ttl_s=ttl,
        max_sessions=max_sessions,
        max_body_bytes=max_body_bytes,
        max_snapshot_bytes=max_snapshot_bytes,
    )
