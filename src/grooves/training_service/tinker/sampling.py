"""Tinker's sampling clients: a sampling session samples one fixed set of weights.

A sampling session is created for the base model (no adapter) or for weights a training model
saved for sampling (`tinker://<model_id>/sampler_weights/<name>`, a peft folder that later steps
never change). Its samples come from the service's own sampler: the saved adapter is served as a
frozen adapter of the caller's table (`service.table`, under `tinker/<model>/<name>`, so it is
also reachable as an OpenAI chat model), and `asample` runs `policy.generate` on it, token ids in
and token ids out, with each sampled token's logprob. At most `max_loaded` saved adapters are
held in memory at once; the one used longest ago is unloaded and loaded again from its folder if
its session samples again, so a loop that saves a sampler every step does not grow the process.

While the training model that saved the weights still holds them (no optimizer step or loaded
state since the save, which `policy.adapters.version` tells), its session samples the training
model's own policy instead: the same weights, with the adapter folded into the base as grooves'
trainer samples, about three times faster on a CPU than the unfolded adapter layers. This is
what an RL loop does between two steps (save, sample, train, save again).

`prompt_logprobs` (what `compute_logprobs` asks for) are the same weights' logprobs of each
prompt token, from one forward of the prompt.
"""

from __future__ import annotations

import contextlib
import math
import threading
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from grooves.core.forward import target_logprobs
from grooves.policy.sampling import SamplingParams
from grooves.training_service.tinker.codec import BadInput, sample_response
from grooves.training_service.tinker.futures import RequestFailed


@dataclass
class SamplingSession:
    session_id: str
    tenant: str
    base_model: str
    model_path: str | None
    """The `tinker://` path it samples (None: the base model)."""
    folder: Path | None
    """The saved adapter's folder (None: the base model)."""
    source: weakref.ref | None = None
    """The training model that saved these weights (None: unknown, or the base model)."""
    version: int | None = None
    """Its adapter's version when it saved them."""

    def live_policy(self):
        """The policy of the training model that saved these weights while it still holds them
        unchanged (call under its lock); else None."""
        model = self.source() if self.source is not None else None
        if model is None or model.policy.adapters.version != self.version:
            return None
        return model.policy

    @property
    def route_name(self) -> str | None:
        """Its name in the tenant's adapter table."""
        if self.folder is None:
            return None
        return f"tinker/{self.folder.parent.parent.name}/{self.folder.name}"


class Samplers:
    """The sampling sessions, and which saved adapters are loaded for them."""

    def __init__(self, service, *, max_loaded: int = 8):
        self.service = service
        self.sessions: dict[str, SamplingSession] = {}
        self.max_loaded = max_loaded
        self._loaded: OrderedDict[tuple[str, str], None] = OrderedDict()  # (tenant, route name), oldest first
        self._saved: dict[tuple[str, str], tuple[weakref.ref, int]] = {}  # (tenant, path): (model, version)
        self._lock = threading.Lock()

    def saved(self, tenant: str, model_path: str, model, version: int) -> None:
        """`model` (a `TinkerModel`) saved its adapter at `version` for sampling under `model_path`."""
        with self._lock:
            self._saved[(tenant, model_path)] = (weakref.ref(model), version)

    def open(
        self, tenant: str, base_model: str, model_path: str | None, folder: Path | None
    ) -> SamplingSession:
        session = SamplingSession(uuid.uuid4().hex[:16], tenant, base_model, model_path, folder)
        if model_path is not None:
            with self._lock:
                session.source, session.version = self._saved.get((tenant, model_path), (None, None))
        self.sessions[session.session_id] = session
        return session

    def get(self, tenant: str, session_id: str) -> SamplingSession:
        session = self.sessions.get(session_id)
        if session is None or session.tenant != tenant:
            raise KeyError(session_id)
        return session

    def sample(self, session: SamplingSession, request: dict) -> bytes:
        """One `asample` request on `session` (blocking): a `SampleResponse` message."""
        prompt = prompt_tokens(request.get("prompt"))
        n = request.get("num_samples", 1)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= self.service.max_n:
            raise BadInput(f"num_samples: {n!r}; send 1..{self.service.max_n} (--max-n)")
        params = self._params(request.get("sampling_params") or {}, len(prompt), n)
        policy = self.service.base_policy
        vocab = int(policy.model.get_input_embeddings().num_embeddings)
        if any(not 0 <= t < vocab for t in prompt):
            bad = next(t for t in prompt if not 0 <= t < vocab)
            raise BadInput(f"prompt: {bad} is not a token id of this model (its ids are 0..{vocab - 1})")
        with policy.lock:  # the training models' lock too: no step between the check and the sampling
            live = session.live_policy()
            if live is not None:
                if params.seed is None:  # drawn here: the training model's own generator is its state
                    params.seed = int(torch.randint(0, 2**62, (1,), generator=policy.generator))
                completions, lps = self._generate(live, live, None, prompt, params, request)
        if live is None:
            with self._route(session) as adapter:
                completions, lps = self._generate(
                    self.service.policy, policy, adapter, prompt, params, request
                )
        sequences = [
            (c.token_ids, c.logprobs, "stop" if c.finish_reason == "stop" else "length") for c in completions
        ]
        return sample_response(sequences, lps)

    def _generate(self, sampler, scorer, adapter: str | None, prompt: list[int], params, request: dict):
        """(completions, prompt logprobs or None): `sampler.generate` on `adapter`; `scorer` is the
        policy whose model scores the prompt on the same weights."""
        completions = sampler.generate([prompt], [params], adapter)[0]
        lps = None
        if request.get("prompt_logprobs"):
            lps = self._prompt_logprobs(scorer, adapter, prompt, request.get("prompt_logprobs_last_n"))
        return completions, lps

    def _params(self, p: dict, prompt_len: int, n: int) -> SamplingParams:
        if p.get("top_k", -1) not in (-1, 0):
            raise BadInput(
                f"sampling_params.top_k: {p['top_k']}; top-k sampling is not supported here (send -1)"
            )
        context = self.service.base_policy.prompts.max_context
        room = context - prompt_len
        if room < 1:
            raise BadInput(f"prompt: {prompt_len} tokens leave no room in the model's context of {context}")
        most = min(room, self.service.max_request_tokens // n if self.service.max_request_tokens else room)
        max_tokens = p.get("max_tokens")
        if max_tokens is None:
            max_tokens = most
        if not isinstance(max_tokens, int) or not 1 <= max_tokens <= most:
            raise BadInput(
                f"sampling_params.max_tokens: {max_tokens!r}; at most {most} here (the model's context of "
                f"{context} less the prompt, and --max-request-tokens over num_samples)"
            )
        temperature = float(p.get("temperature", 1.0))
        if not (temperature == 0 or 1e-5 <= temperature <= 100):
            raise BadInput(f"sampling_params.temperature: {temperature}; send 0 (greedy) or 1e-5..100")
        top_p = float(p.get("top_p", 1.0))
        if not 0 < top_p <= 1:
            raise BadInput(f"sampling_params.top_p: {top_p}; send a number in (0, 1]")
        seed = p.get("seed")
        if seed is not None and (not isinstance(seed, int) or seed < 0):
            raise BadInput(f"sampling_params.seed: {seed!r} is not a non-negative integer")
        return SamplingParams(
            n=n,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=self._stops(p.get("stop")),
            seed=None if seed is None else seed % 2**63,
        )

    def _stops(self, stop) -> list[str]:
        """Tinker's stop strings or stop token ids as the sampler's stop strings (a token id by its
        text, special tokens included); the end-of-sequence token always stops."""
        if stop is None:
            return []
        if isinstance(stop, str):
            return [stop]
        if isinstance(stop, list) and not stop:
            raise BadInput(
                "sampling_params.stop: [] (never stop, not even at end of sequence) is not supported here"
            )
        tokenizer = self.service.base_policy.tokenizer
        out = []
        for s in stop:
            if isinstance(s, str) and s:
                out.append(s)
            elif isinstance(s, int) and not isinstance(s, bool) and 0 <= s < len(tokenizer):
                if s not in (tokenizer.eos_token_id,):
                    out.append(tokenizer.decode([s], skip_special_tokens=False))
            else:
                raise BadInput(f"sampling_params.stop: {s!r} is neither a non-empty string nor a token id")
        return out

    @contextlib.contextmanager
    def _route(self, session: SamplingSession) -> Iterator[str | None]:
        """Inside: the session's adapter is loaded and leased; yields its adapter id (None: the base)."""
        name, folder = session.route_name, session.folder
        if name is None or folder is None:  # the base model
            yield None
            return
        self._ensure_loaded(session.tenant, name, folder)
        with self.service.table.lease(name) as route:
            yield route.adapter_id

    def _ensure_loaded(self, tenant: str, name: str, folder: Path) -> None:
        table = self.service.table
        with self._lock:
            key = (tenant, name)
            if key in self._loaded and table.owns(tenant, name):
                self._loaded.move_to_end(key)
                return
            if not folder.is_dir():
                raise RequestFailed(f"the sampler weights {name!r} are gone from the service's disk")
            self._add(table, tenant, name, folder)
            self._loaded[key] = None
            while len(self._loaded) > self.max_loaded:
                (old_tenant, old_name), _ = self._loaded.popitem(last=False)
                self.service.unload_owned(old_tenant, old_name)

    def _add(self, table, tenant: str, name: str, folder: Path) -> None:
        if not table.owns(tenant, name):
            self.service.load_owned(tenant, name, folder)

    @staticmethod
    def _prompt_logprobs(policy, adapter: str | None, prompt: list[int], last_n) -> list[float]:
        """The logprob of each prompt token under the session's weights (NaN where none is computed:
        the first token, and those before the last `last_n`)."""
        ids = torch.tensor(prompt, dtype=torch.long)[None]  # [1, N]
        with torch.no_grad(), policy.lock, policy.adapters.scope(adapter):
            device = policy.model.get_input_embeddings().weight.device
            logits = policy.model(input_ids=ids.to(device), use_cache=False).logits[0]  # [N, V]
            steps = torch.arange(len(prompt) - 1, device=logits.device)
            lp, _ = target_logprobs(logits, steps, ids[0, 1:].to(logits.device))  # [N - 1]
        out = [math.nan] + lp.tolist()
        if last_n is not None:
            out = [math.nan] * (len(out) - last_n) + out[len(out) - last_n :]
        return out


def prompt_tokens(prompt) -> list[int]:
    """The token ids of a JSON `ModelInput` (`{"chunks": [{"type": "encoded_text", "tokens": [...]}]}`)."""
    if not isinstance(prompt, dict) or not isinstance(prompt.get("chunks"), list):
        raise BadInput("prompt: a ModelInput with a list of chunks is expected")
    tokens: list[int] = []
    for i, chunk in enumerate(prompt["chunks"]):
        if not isinstance(chunk, dict) or chunk.get("type", "encoded_text") != "encoded_text":
            raise BadInput(f"prompt.chunks[{i}]: only token-id chunks are supported (no images or audio)")
        ids = chunk.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise BadInput(f"prompt.chunks[{i}].tokens: a list of integer token ids is expected")
        tokens += ids
    if not tokens:
        raise BadInput("prompt: no tokens")
    return tokens
