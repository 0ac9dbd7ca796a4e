"""Helpers for the Tinker SDK tests: `grooves serve --train` on a tiny model behind a real HTTP
server (the SDK speaks HTTP from threads of its own), and the SDK's clients pointed at it."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path

import tinker
import torch
import uvicorn

from grooves.serve.keys import ApiKeys
from grooves.training_service.app import create_service_app

os.environ.setdefault("TINKER_TELEMETRY", "0")  # nothing to send reports to from a test

ALICE, BOB = "tml-alice-0123456789", "tml-bob-9876543210"
"""Two tenants' keys, with the `tml-` prefix the SDK requires of a key."""


@contextlib.contextmanager
def tinker_server(root: Path, model_dir, *, keys: bool = True):
    """(base_url, app): a training service on `model_dir` over HTTP on a free loopback port,
    with the keys ALICE and BOB (tenants alice and bob) unless `keys` is False."""
    api_keys = ApiKeys({"alice": ALICE, "bob": BOB}) if keys else None
    app = create_service_app(root, str(model_dir), keys=api_keys)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        app.state.scheduler.close()
        app.state.service.close(reports=False)


@contextlib.contextmanager
def client(url: str, key: str = ALICE):
    """The SDK's `ServiceClient` on `url` with `key`, closed (its session finished) on the way out."""
    sc = tinker.ServiceClient(base_url=url, api_key=key)
    try:
        yield sc
    finally:
        sc.close("success").result()


def trained(app, model_id: str) -> dict[str, torch.Tensor]:
    """A copy of the LoRA weights of the service's Tinker model `model_id`."""
    policy = app.state.tinker.models[model_id].policy
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}


def rl_datum(prompt: list[int], completion: list[int], sampled_logprobs: list[float], advantage: float):
    """A Tinker RL datum as tinker-cookbook builds one: input = sequence[:-1], targets = sequence[1:],
    the sampler's logprobs and the advantage on the completion's positions, 0 on the prompt's."""
    seq = prompt + completion
    pad = [0.0] * (len(prompt) - 1)
    return tinker.types.Datum(
        model_input=tinker.types.ModelInput.from_ints(seq[:-1]),
        loss_fn_inputs={
            "target_tokens": seq[1:],
            "logprobs": pad + list(sampled_logprobs),
            "advantages": pad + [advantage] * len(completion),
        },
    )
