"""verifiers' streamed traces, assembled and read as grooves trajectories with exact token records.

verifiers' environment server streams each rollout's traces as deltas (msgpack maps): a trace's
header once (`open`), then appended `nodes` and `calls`, and scalar fields (`set`: rewards,
stop condition, ...) whenever they change; a `discard` drops a trace a retried attempt
abandoned. `TraceAssembly` applies them in order into plain dicts.

A trace is a graph of message nodes. Each node holds the tokens it adds to its branch's
sequence (`token_ids`), which of them the model sampled (`mask`) and the sampling logprobs of
those (`logprobs`); the ids of a root-to-node path, concatenated, are the exact sequence the
model saw and wrote. `trajectory_of` turns every sampled node into a grooves `SampledTurn`: its
prompt is its ancestors' ids plus the node's own unsampled scaffold (the generation prompt), its
completion the sampled span. grooves' tokenizer then rebuilds each branch as one sequence and
trains only on the sampled tokens: user and tool text between turns is context, masked out.

A sampled node without token ids (a trace from a client that records none, verifiers' `eval`
client) cannot be trained on and is refused (`TraceError`) rather than re-tokenized.

Every turn also records the adapter version that sampled it (`adapter_version`, given by the
caller: the version behind the model name the episode sampled with), as the turns of any other
task do, so the step measures their staleness, enforces `rollout.max_staleness` and, under
truncated importance sampling, takes their old logprobs under that version's weights.
"""

from __future__ import annotations

from typing import Any

from grooves.core.trajectory import SampledTurn, Trajectory

LIST_FIELDS = ("nodes", "calls", "errors", "extra_usage", "request_rewrites", "response_rewrites")


class TraceError(ValueError):
    """A trace grooves cannot train on; the message says which and why."""


class TraceAssembly:
    """The traces of one rollout as their deltas arrive."""

    def __init__(self) -> None:
        self.traces: dict[str, dict[str, Any]] = {}

    def apply(self, delta: dict[str, Any]) -> None:
        trace_id = delta["trace"]
        if delta.get("discard"):
            self.traces.pop(trace_id, None)
            return
        trace = self.traces.get(trace_id)
        if trace is None:
            trace = self.traces[trace_id] = {**delta.get("open", {}), **{f: [] for f in LIST_FIELDS}}
        for index, links in (delta.get("links") or {}).items():
            trace["nodes"][int(index)].setdefault("semantic_parents", []).extend(links)
        for field in LIST_FIELDS:
            trace[field].extend(delta.get(field) or [])
        trace.update(delta.get("set") or {})

    def finish(self, summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The finished traces in the server's order, checked against its counts (a lost delta fails loudly)."""
        out = []
        for summary in summaries:
            trace = self.traces.get(summary["id"])
            if trace is None:
                raise TraceError(f"the environment server reported trace {summary['id']} but sent none of it")
            if len(trace["nodes"]) != summary["nodes"] or len(trace["calls"]) != summary["calls"]:
                raise TraceError(
                    f"trace {summary['id']}: assembled {len(trace['nodes'])} nodes and {len(trace['calls'])} calls, "
                    f"the server reports {summary['nodes']} and {summary['calls']}"
                )
            out.append(trace)
        return out


def reward_of(trace: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """The trace's reward (verifiers' sum of score x weight) and each named reward's score."""
    parts = {name: r for name, r in (trace.get("rewards") or {}).items() if r is not None}
    total = sum(float(r["score"]) * float(r.get("weight", 1.0)) for r in parts.values())
    return total, {name: float(r["score"]) for name, r in parts.items()}


def _path(nodes: list[dict[str, Any]], index: int | None) -> list[int]:
    """Node indices from the root down to `index`, inclusive."""
    path: list[int] = []
    seen: set[int] = set()
    while index is not None:
        if index in seen or not 0 <= index < len(nodes):
            raise TraceError(f"trace nodes do not form a tree (node {index})")
        seen.add(index)
        path.append(index)
        index = nodes[index].get("parent")
    return path[::-1]


def sampled_turns(
    trace: dict[str, Any], temperature: float, adapter_version: int | None = None
) -> list[SampledTurn]:
    """One `SampledTurn` per node the model sampled, in the order they were written, each recording
    `adapter_version` (the adapter version that sampled the episode; None: unknown)."""
    nodes = trace["nodes"]
    turns = []
    for i, node in enumerate(nodes):
        mask = list(node.get("mask") or [])
        if not node.get("sampled") and not any(mask):
            continue
        ids = list(node.get("token_ids") or [])
        if not ids or not any(mask):
            raise TraceError(
                f"trace {trace.get('id')}: sampled turn (node {i}) carries no token ids; the environment server "
                "must sample through grooves' token route (a client config of type 'train'), not 'eval'"
            )
        if len(mask) != len(ids):
            raise TraceError(
                f"trace {trace.get('id')}: node {i} has {len(ids)} token ids but {len(mask)} mask entries"
            )
        first = mask.index(True)
        if not all(mask[first:]):
            raise TraceError(
                f"trace {trace.get('id')}: node {i}'s sampled tokens are not one span at its end"
            )
        logprobs = [float(x) for x in node.get("logprobs") or []]
        if len(logprobs) != len(ids) - first:
            raise TraceError(
                f"trace {trace.get('id')}: node {i} sampled {len(ids) - first} tokens but carries {len(logprobs)} logprobs"
            )
        prefix = [t for j in _path(nodes, i)[:-1] for t in nodes[j].get("token_ids") or []]
        message = node.get("message") or {}
        turns.append(
            SampledTurn(
                prompt_token_ids=prefix + ids[:first],
                token_ids=ids[first:],
                logprobs=logprobs,
                text=message.get("content") or "",
                finish_reason=_finish_of(trace, i),
                temperature=temperature,
                adapter_version=adapter_version,
            )
        )
    return turns


def _finish_of(trace: dict[str, Any], node: int) -> str:
    for call in trace.get("calls") or []:
        if call.get("node") == node and call.get("finish_reason"):
            return "length" if call["finish_reason"] == "length" else "stop"
    return "stop"


def _messages(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation along the branch that ends at the last node (what a reader of the trajectory sees)."""
    nodes = trace["nodes"]
    if not nodes:
        return []
    out = []
    for j in _path(nodes, len(nodes) - 1):
        message = {k: v for k, v in (nodes[j].get("message") or {}).items() if v is not None}
        out.append(message)
    return out


def trajectory_of(
    trace: dict[str, Any],
    *,
    temperature: float,
    success_threshold: float = 1.0,
    adapter_version: int | None = None,
) -> Trajectory:
    """A grooves trajectory of one verifiers trace: its turns' exact ids (each recording
    `adapter_version`, the version that sampled them), its reward and its parts."""
    turns = sampled_turns(trace, temperature, adapter_version)
    if not turns:
        raise TraceError(f"trace {trace.get('id')} holds no sampled turn: nothing to train on")
    reward, parts = reward_of(trace)
    errors = [f"{e.get('type')}: {e.get('message')}" for e in trace.get("errors") or []]
    return Trajectory(
        messages=_messages(trace),
        turns=turns,
        reward=reward,
        rewards=parts,
        metrics={"success": float(reward >= success_threshold), "turns": float(len(turns))},
        metadata={
            "trace_id": trace.get("id"),
            "stop_condition": trace.get("stop_condition"),
            "verifiers_errors": errors,
        },
    )
