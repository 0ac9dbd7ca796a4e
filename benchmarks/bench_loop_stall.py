"""How long one heavy chat request holds up the server's other routes (its event loop).

A tiny random model behind `grooves serve`'s app on a loopback port; one chat request whose cost
grows with its body (a `json_schema` of many properties to compile, or many messages to read,
validate and render) is sent, and `/v1/models` is asked every 20 ms while it runs. The figure is
the worst `/v1/models` latency seen: near the time of one HTTP round trip when the request's work
runs off the event loop, up to the whole of that work when it runs on it.

    python benchmarks/bench_loop_stall.py --schema-properties 5000
    python benchmarks/bench_loop_stall.py --messages 200000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from grooves.policy.transformers import TransformersPolicy
from grooves.scale.policy_server import ThreadedServer
from grooves.serve.app import create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny_models import build_tiny_model_dir  # noqa: E402


def heavy_body(schema_properties: int, messages: int) -> dict:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi there"}] * max(messages, 1),
        "max_tokens": 1,
    }
    if schema_properties:
        schema = {
            "type": "object",
            "properties": {f"field_{i}": {"type": "string"} for i in range(schema_properties)},
        }
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}
    return body


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schema-properties", type=int, default=0, help="a json_schema of this many properties")
    ap.add_argument("--messages", type=int, default=1, help="this many one-line user messages")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()
    model_dir = build_tiny_model_dir(tempfile.mkdtemp(prefix="grooves-stall-"))
    policy = TransformersPolicy(str(model_dir), served_name="tiny")
    data = json.dumps(heavy_body(args.schema_properties, args.messages)).encode()
    with ThreadedServer(create_app(policy)) as server:
        url = server.base_url
        warm = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        httpx.post(
            url + "/v1/chat/completions",
            json=warm | {"response_format": {"type": "json_object"}},
            timeout=120,
        )
        done, result = threading.Event(), {}

        def heavy() -> None:
            start = time.perf_counter()
            resp = httpx.post(
                url + "/v1/chat/completions",
                content=data,
                headers={"content-type": "application/json"},
                timeout=3600,
            )
            result.update(status=resp.status_code, seconds=round(time.perf_counter() - start, 3))
            done.set()

        threading.Thread(target=heavy).start()
        worst, asked = 0.0, 0
        while not done.is_set():
            start = time.perf_counter()
            httpx.get(url + "/v1/models", timeout=3600)
            worst, asked = max(worst, time.perf_counter() - start), asked + 1
            time.sleep(0.02)
    out = {
        "schema_properties": args.schema_properties,
        "messages": args.messages,
        "body_bytes": len(data),
        "heavy_request": result,
        "models_requests": asked,
        "worst_models_latency_s": round(worst, 3),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
