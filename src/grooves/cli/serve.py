"""`grooves serve`: a policy behind the OpenAI-compatible API (adapter admin endpoints with `--admin`);
with `--train`, the training service (trainable models that a user's own loop trains over HTTP).

Kept apart from the code it drives so that `grooves --help` stays fast: torch and transformers
are imported only inside the command.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, replace
from typing import Any

import typer
from rich.console import Console

from grooves.models import DEFAULT_MODEL, ModelError, served_name_of
from grooves.training_service.validate import (
    MAX_SEQUENCE_TOKENS,
    MAX_STEP_TOKENS,
    MAX_STEP_TRAJECTORIES,
    StepLimits,
)

console = Console(soft_wrap=True)  # paths and messages stay on one line, copyable
err = Console(stderr=True, soft_wrap=True)


def _fail(message: str) -> typer.Exit:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code=1)


def serve_command(
    model: str = typer.Option(
        DEFAULT_MODEL,
        "--model",
        help="Built-in alias (smollm2-135m), a local directory or a Hugging Face id.",
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Interface to bind; 0.0.0.0 exposes the server to the network."
    ),
    port: int = typer.Option(8000, "--port"),
    adapter: list[str] = typer.Option(
        [],
        "--adapter",
        help="A LoRA adapter (peft folder, checkpoint or run folder). PATH: the model itself uses it; "
        "NAME=PATH: served as model NAME beside the base (repeatable; more load at run time via /v1/adapters).",
    ),
    admin: bool = typer.Option(
        False,
        "--admin",
        help="Mount /v1/adapters (load, unload, promote, roll back at run time). They load any path on this "
        "machine's disk: only with --api-key, or on a loopback host.",
    ),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar="GROOVES_API_KEY",
        help="Require 'Authorization: Bearer KEY' on every route (401 otherwise); or set GROOVES_API_KEY.",
    ),
    max_n: int = typer.Option(
        64, "--max-n", min=1, help="Largest `n` one request may ask for (samples share one prefill)."
    ),
    max_request_tokens: int | None = typer.Option(
        None,
        "--max-request-tokens",
        min=1,
        help="Largest n x max_tokens one request may ask for; default 65536.",
    ),
    max_body_bytes: int | None = typer.Option(
        None, "--max-body-bytes", min=1, help="Largest request body; default 8 MiB (8388608)."
    ),
    served_name: str | None = typer.Option(
        None,
        "--served-name",
        help="Model name clients send; default: the --model alias or hub id, or a directory's own name (its last part).",
    ),
    device: str = typer.Option("cpu", "--device", help="torch device: cpu, cuda, cuda:1, mps."),
    dtype: str = typer.Option(
        "float32", "--dtype", help="float32 keeps sampler and trainer logprobs equal; bfloat16 halves memory."
    ),
    backend: str = typer.Option(
        "transformers",
        "--backend",
        help="transformers (grooves' own sampler) or vllm (vLLM's engine: a CUDA GPU, or the CPU build in "
        ".venv-vllm; see docs/vllm.md).",
    ),
    train: bool = typer.Option(
        False,
        "--train",
        help="Also host trainable models: clients create them, sample them and send scored groups for "
        "training steps (/v1/trainable_models; see docs/service.md). No /v1/adapters admin routes.",
    ),
    train_dir: str = typer.Option(
        "runs/service",
        "--train-dir",
        help="With --train: one run folder per trainable model; a restart brings each back at its last checkpoint.",
    ),
    max_models: int = typer.Option(
        8, "--max-models", min=1, help="With --train: most trainable models at once."
    ),
    api_keys: str | None = typer.Option(
        None,
        "--api-keys",
        help='A TOML file of tenants and their keys ([keys] alice = "..."): each key sees and trains only its own models.',
    ),
    max_step_tokens: int = typer.Option(
        MAX_STEP_TOKENS,
        "--max-step-tokens",
        min=1,
        help="With --train: most prompt and sampled token ids one training step may carry (413 past it).",
    ),
    max_step_trajectories: int = typer.Option(
        MAX_STEP_TRAJECTORIES,
        "--max-step-trajectories",
        min=1,
        help="With --train: most trajectories one training step may hold (413 past it).",
    ),
    max_sequence_tokens: int = typer.Option(
        MAX_SEQUENCE_TOKENS,
        "--max-sequence-tokens",
        min=1,
        help="With --train: most tokens in one turn's prompt plus completion (400 past it; the model's "
        "context and one micro-batch's memory bound it too).",
    ),
) -> None:
    """Serve a policy over an OpenAI-compatible HTTP API (/v1/models, /v1/chat/completions)."""
    options = ServeOptions(
        model=model,
        host=host,
        port=port,
        adapter=list(adapter),
        admin=admin,
        api_key=api_key,
        max_n=max_n,
        max_request_tokens=max_request_tokens,
        max_body_bytes=max_body_bytes,
        served_name=served_name,
        device=device,
        dtype=dtype,
        backend=backend,
        train=train,
        train_dir=train_dir,
        max_models=max_models,
        api_keys=api_keys,
        max_step_tokens=max_step_tokens,
        max_step_trajectories=max_step_trajectories,
        max_sequence_tokens=max_sequence_tokens,
    )
    run_serve(options)


@dataclass(frozen=True)
class ServeOptions:
    """`grooves serve`'s flags, one field each (`serve_command` holds each flag's help)."""

    model: str
    host: str
    port: int
    adapter: list[str]
    admin: bool
    api_key: str | None
    max_n: int
    max_request_tokens: int | None
    max_body_bytes: int | None
    served_name: str | None
    device: str
    dtype: str
    backend: str
    train: bool
    train_dir: str
    max_models: int
    api_keys: str | None
    max_step_tokens: int
    max_step_trajectories: int
    max_sequence_tokens: int


def run_serve(options: ServeOptions) -> None:
    """Check the options, then serve until interrupted: the policy, or with `train` the training service.
    A bad option or model ends in one red line and exit code 1."""
    o = replace(
        options,
        api_key=options.api_key or None,  # GROOVES_API_KEY="" sets no key
        served_name=options.served_name or served_name_of(options.model),  # a name, never the operator's path
    )
    own, named, keys = _adapters_and_keys(o)
    if keys is None and o.api_key is None and o.host not in ("127.0.0.1", "localhost", "::1"):
        console.print(
            f"warning: --host {o.host} without --api-key: anyone who reaches this port can use the server",
            highlight=False,
        )
    limits: dict[str, Any] = {
        k: v
        for k, v in {"max_request_tokens": o.max_request_tokens, "max_body_bytes": o.max_body_bytes}.items()
        if v is not None
    }
    if o.backend not in ("transformers", "vllm"):
        raise _fail(f"--backend {o.backend!r}: use transformers or vllm")
    if o.train and o.backend == "vllm":
        raise _fail(
            "--backend vllm with --train: the training service shares one base model among trainable models "
            "on transformers; drop --backend, or train with model.backend = 'vllm' in a run file"
        )
    if o.train:
        limits["limits"] = StepLimits(o.max_step_tokens, o.max_step_trajectories, o.max_sequence_tokens)
        _serve_training(o, own, named, keys, limits)
    else:
        _serve_policy(o, own, named, keys, limits)


def _name(o: ServeOptions) -> str:
    """The served model's name, which `run_serve` has set."""
    assert o.served_name is not None
    return o.served_name


def _adapters_and_keys(o: ServeOptions):
    """(the base model's own adapter or None, the named adapters, the tenants' `ApiKeys` or None);
    a bad `--adapter` or an option that contradicts another ends in one red line."""
    from grooves.cli.adapters import parse_adapter_options
    from grooves.serve.keys import ApiKeys

    try:
        own, named = parse_adapter_options(o.adapter, _name(o))
        if o.api_key and o.api_keys:
            raise ValueError("--api-key and --api-keys: pass one of them (a keys file can hold one key)")
        if o.train and o.admin:
            raise ValueError(
                "--admin with --train: the training service has no /v1/adapters routes (they load any path on "
                "this machine's disk); tenants promote their own checkpoints instead"
            )
        # a tenant per key: a keys file, or with --train the one key as the tenant "default"
        keys = (
            ApiKeys.from_file(o.api_keys)
            if o.api_keys
            else ApiKeys.single(o.api_key)
            if o.api_key and o.train
            else None
        )
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    return own, named, keys


def _serve_policy(o: ServeOptions, own, named, keys, limits: dict) -> None:
    """`grooves serve`: the policy (and its named adapters) behind the OpenAI-compatible API."""
    from grooves.adapters.admin import mount_admin
    from grooves.config import ConfigError
    from grooves.serve.app import create_app, serve
    from grooves.serve.routing import ModelRoutes

    try:
        policy = _serving_policy(o.backend, o.model, own, _name(o), o.device, o.dtype)
    except ModelError as exc:
        raise _fail(str(exc)) from exc
    except (ConfigError, ImportError) as exc:  # the vLLM backend cannot start as asked: one line each
        raise _fail(str(exc)) from exc
    except OSError as exc:  # transformers' error for a hub id it cannot reach or find
        raise _fail(
            f"could not load --model {o.model!r}: {exc}\nfix: pass a local model directory, or {DEFAULT_MODEL} (works offline)"
        ) from exc
    table = ModelRoutes(policy, own_path=str(own) if own else None)
    for name, path in named:
        table.add(name, path)
    console.print(
        f"serving [bold]{', '.join(table.names())}[/bold] at http://{o.host}:{o.port}/v1", highlight=False
    )
    if o.device == "cpu" and o.backend == "transformers" and "OMP_WAIT_POLICY" not in os.environ:
        # libgomp's spinning threads stall the sampler when other processes share the cores (CHANGELOG.md, change 2)
        console.print(
            "tip: on a shared machine start with OMP_WAIT_POLICY=PASSIVE (see docs/serving.md)",
            highlight=False,
        )
    app = create_app(
        policy,
        max_n=o.max_n,
        adapters=table,
        api_key=o.api_key if keys is None else None,
        keys=keys,
        **limits,
    )
    if o.admin:
        mount_admin(app)
    serve(app, host=o.host, port=o.port)


def _serving_policy(backend: str, model: str, own, served_name: str, device: str, dtype: str):
    """The policy `grooves serve` samples with: grooves' own sampler, or vLLM's engine (sampling only)."""
    if backend == "vllm":
        from grooves.policy.vllm import VLLMPolicy

        return VLLMPolicy(
            model, lora=None, adapter_path=own, served_name=served_name, device=device, dtype=dtype
        )
    from grooves.policy.transformers import TransformersPolicy

    return TransformersPolicy(model, adapter_path=own, served_name=served_name, device=device, dtype=dtype)


def _serve_training(o: ServeOptions, own, named, keys, limits: dict) -> None:
    """`grooves serve --train`: the training service until interrupted, then each model's report."""
    from grooves.serve.app import serve
    from grooves.training.runlog import RunFolderError
    from grooves.training_service.app import create_service_app

    if own is not None:
        raise _fail(
            f"--adapter {own}: with --train the base model has no adapter of its own; serve it as --adapter NAME=PATH"
        )
    try:
        app = create_service_app(
            o.train_dir,
            o.model,
            keys=keys,
            served_name=o.served_name,
            adapters=[(name, str(path)) for name, path in named],
            dtype=o.dtype,
            device=o.device,
            max_models=o.max_models,
            max_n=o.max_n,
            **limits,
        )
    except ModelError as exc:
        raise _fail(str(exc)) from exc
    except RunFolderError as exc:
        raise _fail(f"--train-dir: {exc}") from exc
    except OSError as exc:
        raise _fail(
            f"could not load --model {o.model!r}: {exc}\nfix: pass a local model directory, or {DEFAULT_MODEL} (works offline)"
        ) from exc
    service = app.state.service
    names = ", ".join(app.state.adapters.names())
    console.print(
        f"training service on [bold]{names}[/bold] at http://{o.host}:{o.port}/v1 "
        f"({len(service.models)} trainable models restored from {o.train_dir})",
        highlight=False,
    )
    # uvicorn stops on SIGTERM as on SIGINT, then raises the signal again under the handler it found:
    # the default one ends the process at once, so this one turns it into an exit that runs `finally`
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        serve(app, host=o.host, port=o.port)
    finally:
        signal.signal(signal.SIGTERM, previous)
        app.state.scheduler.close()
        service.close()


def _exit_on_sigterm(signum: int, frame) -> None:
    raise SystemExit(128 + signum)
