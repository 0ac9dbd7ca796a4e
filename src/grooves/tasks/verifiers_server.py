"""verifiers' environment server, started by `grooves.tasks.verifiers` in verifiers' own virtualenv.

This file is run as a script by that virtualenv's Python (`python verifiers_server.py ...`); it
imports verifiers, never grooves, so grooves' own environment needs no verifiers and verifiers'
needs no grooves. It checks the installed verifiers version, resolves the environment's config
(its taskset id names an installed package), writes the taskset's rows for each split grooves
asks for to a JSON file (verifiers' client owns the rows and ships one with each rollout; the
server never loads them), and serves the environment on a ZeroMQ address until it is stopped.
Any failure before serving is one line on stderr and exit status 2; an environment that is
installed but cannot be imported names the import that failed, not "not installed".
"""

from __future__ import annotations

import argparse
import json
import sys

SUPPORTED = ((0, 4), (0, 5))
"""verifiers versions this server script and grooves' driver speak: at least 0.4, below 0.5."""


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _check_version() -> str:
    try:
        from importlib.metadata import version

        found = version("verifiers")
    except Exception:  # not installed in this Python
        _fail(
            f"verifiers is not installed in {sys.executable}; build its virtualenv with make setup-verifiers"
        )
    parts = tuple(int(p) for p in found.split(".")[:2] if p.isdigit())
    low, high = SUPPORTED
    if not low <= parts < high:
        _fail(
            f"verifiers {found} is installed in {sys.executable}; grooves drives verifiers "
            f">= {'.'.join(map(str, low))}, < {'.'.join(map(str, high))} (constraints/verifiers.txt)"
        )
    return found


def _not_found(env_id: str, exc: ModuleNotFoundError) -> str:
    """The line for a module that could not be found while loading `env_id`: the environment's own
    package not installed, or, where it is installed, the import that failed inside it (a package
    it or verifiers needs), which verifiers' loader reports as the environment "not found"."""
    import importlib.util

    cause: BaseException = exc
    while isinstance(inner := cause.__cause__ or cause.__context__, ModuleNotFoundError):
        cause = inner  # the import that failed first, under verifiers' own "not found"
    package = env_id.rsplit("/", 1)[-1].replace("-", "_")
    try:
        installed = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a name that is no module name
        installed = False
    if not installed:
        return f"verifiers environment {env_id!r} is not installed in {sys.executable}: {exc}"
    return (
        f"verifiers environment {env_id!r} is installed in {sys.executable} but could not be imported: "
        f"{type(cause).__name__}: {cause} (install what it needs there)"
    )


def _rows(config: dict, overrides: dict[str, dict]) -> dict[str, list[dict]]:
    """Each split's task rows, dumped as the server validates them back."""
    from verifiers.v1.utils.loaders import load_environment, resolve_env_config

    out = {}
    for split, taskset in overrides.items():
        data = json.loads(json.dumps(config))
        data["taskset"] = {**data.get("taskset", {}), **taskset}
        env = load_environment(resolve_env_config(data))
        out[split] = [task.data.model_dump(mode="json") for task in env.taskset.load()]
    return out


def _warm() -> None:
    """Build the environment verifiers' chat harness runs its program in (uv fetches its packages):
    done once by `make setup-verifiers`, so that a training run installs nothing."""
    import asyncio

    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessConfig, SubprocessRuntime

    async def prepare() -> None:
        runtime = SubprocessRuntime(SubprocessConfig())
        await runtime.start()
        try:
            await runtime.prepare_uv_script(CHAT_PROGRAM_SOURCE, {})
        finally:
            await runtime.stop()

    asyncio.run(prepare())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--warm", action="store_true", help="prepare the chat harness's program, then exit")
    parser.add_argument("--config", help="the environment's config as JSON")
    parser.add_argument("--splits", help="split name -> taskset overrides, as JSON")
    parser.add_argument("--rows", help="where to write the rows of each split (JSON)")
    parser.add_argument("--address", help="the ZeroMQ address to serve on")
    args = parser.parse_args(argv)
    version = _check_version()
    if args.warm:
        _warm()
        return
    config = json.loads(args.config)
    env_id = config.get("taskset", {}).get("id", "")
    try:
        rows = _rows(config, json.loads(args.splits))
    except ModuleNotFoundError as exc:
        _fail(_not_found(env_id, exc))
    except Exception as exc:  # the environment's own code failed while loading
        _fail(f"verifiers environment {env_id!r} could not be loaded: {type(exc).__name__}: {exc}")
    with open(args.rows, "w") as out:
        json.dump({"verifiers": version, "rows": rows}, out)

    from verifiers.v1.serve.pool import serve_env
    from verifiers.v1.utils.loaders import resolve_env_config

    serve_env(max_workers=1, address=args.address, config=resolve_env_config(config))


if __name__ == "__main__":
    main()
