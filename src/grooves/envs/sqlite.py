"""A SQLite-backed environment assembled from a `EnvSpec`: the shape every built-in shares.

A built-in environment is data and functions, not a subclass: a seed-data builder, a scenario
generator, tools, a grader, and two kinds of scripted solvers (gold and known-bad) that let the
environment prove its grader with `validate()`. `SqliteEnvironment` composes them into the
`Environment` contract; `LocalEpisode` is one rollout's session over its own database copy.

The episode's clock and tool counters live in a table inside the episode's database, so a
snapshot carries them: a restored or forked episode resumes with the budget it had.
"""

from __future__ import annotations

import json
import random
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grooves.core.trajectory import Trajectory
from grooves.envs.base import (
    SPLITS,
    Grade,
    GraderError,
    Limits,
    Scenario,
    Split,
    ValidationReport,
    as_messages,
    callable_name,
    final_answer,
    parse_tool_call,
    tool_calls_made,
)
from grooves.envs.state import SeedDatabase, SqliteState, check_snapshot
from grooves.envs.tools import Tool, ToolBox, ToolContext, error_content


class Call:
    """What a scripted solver acts through: `call(tool_name, arguments) -> parsed tool result`.

    Each call runs in the episode and is recorded in the chat as the model would make it: an
    assistant message with one tool call, then the tool's reply. `call.say(*phrasings)` gives the
    words of an answer. Played plainly (`validate`), every assistant message is the first phrasing
    and tool calls carry no text; played with `rng` (demonstrations), each answer is one phrasing
    drawn from the seeded `rng` and each tool call is introduced by one of `prefaces`, so a model
    trained on the chats learns the behaviour rather than one string.

    `call` returns the tool's result parsed from JSON (a dict, a list, a number, ...). A call the
    episode refuses returns the error the agent would read, never raises: `{"error": "refused",
    "message": ...}` for a tool's `ToolError`, and the other kinds of the tool error table
    (`unknown_tool`, `schema_violation`, `tool_crashed`, ...) alike, so a solver checks
    `"error" in result` where a refusal is possible.
    """

    def __init__(
        self,
        episode: Any,
        messages: list[dict[str, Any]],
        rng: random.Random | None = None,
        prefaces: Sequence[str] = ("",),
    ):
        self.episode = episode
        self.messages = messages
        self.rng = rng
        self.prefaces = tuple(prefaces) or ("",)
        self.count = 0

    def __call__(self, name: str, arguments: dict[str, Any]) -> Any:
        self.count += 1
        raw = {
            "id": f"call_{self.count}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        preface = self.prefaces[0] if self.rng is None else self.rng.choice(self.prefaces)
        self.messages.append({"role": "assistant", "content": preface, "tool_calls": [raw]})
        reply = self.episode.step(raw)
        self.messages.append(reply)
        try:
            return json.loads(reply["content"])
        except json.JSONDecodeError:
            return {"text": reply["content"]}

    def say(self, *phrasings: str) -> str:
        """One of `phrasings`: the first when played plainly, a seeded choice for demonstrations."""
        if not phrasings:
            raise ValueError("say needs at least one phrasing")
        return phrasings[0] if self.rng is None else self.rng.choice(phrasings)


Solver = Callable[[Scenario, Call], str]
"""A scripted agent, `solver(scenario, call) -> final answer`: it makes tool calls through `call`
(in the order an agent would, each one recorded in the chat) and returns its final answer. It sees
the whole scenario, `expected` included; a gold solver should pass tools only what an agent could
know (the request, earlier results), so its chats make honest demonstrations."""


@dataclass(frozen=True)
class GradeInput:
    """Everything a grader may look at: the end state, the untouched seed, and the chat.

    `state` is the episode's database as the agent left it (`state.one(sql, params)`,
    `state.query(...)`, `state.conn`); `seed.connection` is the database every episode started
    from, so `changed_keys(seed.connection, state.conn, table, key)` names the rows the agent
    added, changed or deleted. `answer` is the final answer (the last assistant message, "" when
    it called a tool); `calls` is every tool call made, as (name, parsed arguments), refused ones
    included.
    """

    scenario: Scenario
    state: SqliteState
    seed: SeedDatabase
    messages: list[dict[str, Any]]
    answer: str
    calls: list[tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class EnvSpec:
    """The parts of one environment. Every callable is deterministic given its inputs."""

    name: str
    description: str
    system_prompt: str
    build_seed: Callable[[sqlite3.Connection, int], None]
    """(empty connection, data seed): create the schema and rows."""
    make_scenarios: Callable[[sqlite3.Connection, int], list[Scenario]]
    """(seed database, data seed): every scenario. Each is a JSON-able dict with `id` (a unique
    string), `split` (train, validation or test) and `prompt` (the user's request, the only part
    the agent sees); `assign_splits` adds `id`, `env` and `split`. Anything else is for the grader
    and the solvers, by convention under `expected`, which is never sent to an agent or a client."""
    tools: Sequence[Tool]
    grade: Callable[[GradeInput], Grade]
    """Scores an episode in [0, 1]: a `Grade` (score, parts logged as reward signals, notes) or a
    float. Raising, or returning anything else, fails that rollout (`GraderError`)."""
    gold: Solver
    """Solves every scenario: `validate()` requires 1.0 on each, and its chats are the demonstrations."""
    bad: Callable[[Scenario], list[Solver]]
    """Known-bad solvers for a scenario (besides the empty answer and an echo of the prompt,
    which are always tried): each must score at most 0.5 on every scenario it is given."""
    limits: Limits = Limits()


_CLOCK_SCHEMA = "CREATE TABLE _episode (key TEXT PRIMARY KEY, value REAL NOT NULL)"
_COUNTERS = ("elapsed_s", "tool_calls", "tool_errors", "budget_exhausted")


class SqliteEnvironment:
    """An `Environment` from a `EnvSpec` and a data seed (same seed, same data and scenarios)."""

    def __init__(self, spec: EnvSpec, *, seed: int = 0, on_disk: bool = False, limits: Limits | None = None):
        self.spec = spec
        self.data_seed = seed
        self.on_disk = on_disk
        self._limits = limits or spec.limits
        self.toolbox = ToolBox(spec.tools, self._limits)
        self.seed_db = SeedDatabase(self._build)
        self._scenarios = check_scenarios(spec.name, spec.make_scenarios(self.seed_db.connection, seed))
        self._by_id = {s["id"]: s for s in self._scenarios}

    def _build(self, conn: sqlite3.Connection) -> None:
        self.spec.build_seed(conn, self.data_seed)
        conn.execute(_CLOCK_SCHEMA)
        conn.executemany("INSERT INTO _episode VALUES (?, 0)", [(k,) for k in _COUNTERS])

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def limits(self) -> Limits:
        return self._limits

    def scenarios(self, split: Split) -> list[Scenario]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return [dict(s) for s in self._scenarios if s["split"] == split]

    def scenario(self, scenario_id: str) -> Scenario:
        try:
            return dict(self._by_id[scenario_id])
        except KeyError:
            raise KeyError(f"{self.name} has no scenario {scenario_id!r}") from None

    def reset(self, scenario: Scenario) -> LocalEpisode:
        """A fresh episode on its own copy of the seed database.

        The scenario is looked up by id, so what the grader checks against always comes from
        the environment, never from whoever sent the scenario.
        """
        if not isinstance(scenario, dict) or "id" not in scenario:
            raise ValueError("reset needs a scenario dict with an 'id' (from env.scenarios(split))")
        trusted = self.scenario(str(scenario["id"]))
        state = SqliteState.from_seed(self.seed_db, on_disk=self.on_disk)
        return LocalEpisode(self, trusted, state)

    def validate(self, splits: Sequence[Split] = SPLITS, bad_threshold: float = 0.5) -> ValidationReport:
        """Play the gold solver (must score 1.0) and every bad solver (must score <= threshold) on
        every scenario of `splits`; the report names each solver and each failure.

        Besides each environment's own bad solvers, two are always tried: an empty answer, and
        an answer that repeats the prompt with no tool calls (a grader that credits ids or
        words the request itself contains would reward parroting). A solver or grader that
        raises is a failure naming it, and the validation goes on.
        """
        gold_name = callable_name(self.spec.gold, "gold")
        gold_scores: list[float] = []
        bad_solvers: dict[str, list[float]] = {}
        failures: list[str] = []
        scenarios = [s for split in splits for s in self.scenarios(split)]
        for sc in scenarios:
            gold, problem = _prove(self, sc, self.spec.gold, f"gold solver {gold_name}")
            gold_scores.append(gold.score if gold is not None else 0.0)
            if problem:
                failures.append(f"{sc['id']}: {problem}")
            elif gold is not None and gold.score < 1.0:
                notes = f" ({'; '.join(gold.notes)})" if gold.notes else ""
                failures.append(
                    f"{sc['id']}: gold solver {gold_name} scored {gold.score:.3f}, not 1.0{notes}"
                )
            for name, solver in self._bad_solvers(sc, failures):
                bad, problem = _prove(self, sc, solver, f"bad solver {name}")
                score = bad.score if bad is not None else 0.0
                bad_solvers.setdefault(name, []).append(score)
                if problem:
                    failures.append(f"{sc['id']}: {problem}")
                elif score > bad_threshold:
                    failures.append(
                        f"{sc['id']}: bad solver {name} scored {score:.3f}, above {bad_threshold}"
                    )
        return ValidationReport(
            env=self.name,
            scenarios=len(scenarios),
            gold_scores=gold_scores,
            bad_scores=[score for scores in bad_solvers.values() for score in scores],
            bad_threshold=bad_threshold,
            failures=failures,
            gold_solver=gold_name,
            bad_solvers=bad_solvers,
        )

    def _bad_solvers(self, scenario: Scenario, failures: list[str]) -> list[tuple[str, Solver]]:
        """(name, solver) of the scenario's bad solvers: the two always tried, then the spec's."""
        try:
            own = list(self.spec.bad(scenario))
        except Exception as exc:  # the author's code: a failure to report, not a crash
            name = callable_name(self.spec.bad, "bad")
            failures.append(f"{scenario['id']}: {name}(scenario) raised {type(exc).__name__}: {exc}")
            own = []
        named = [("empty answer", _empty_answer), ("echo of the prompt", _echo_prompt)]
        return named + [(callable_name(fn, f"bad[{i}]"), fn) for i, fn in enumerate(own)]


def check_scenarios(env_name: str, scenarios: Any) -> list[Scenario]:
    """`scenarios` if each is a dict with a unique string `id`, a `split` of SPLITS and a string
    `prompt`; else a ValueError naming the first that is not and what it lacks.

    >>> check_scenarios("desk", [{"id": "desk-000", "split": "train"}])
    Traceback (most recent call last):
    ...
    ValueError: desk: make_scenarios: scenario 0 ('desk-000') has no 'prompt'; each scenario needs a string id, a split (train, validation or test) and a string prompt (assign_splits adds id, env and split)
    """
    need = (
        "each scenario needs a string id, a split (train, validation or test) and a string prompt "
        "(assign_splits adds id, env and split)"
    )
    if not isinstance(scenarios, list):
        raise ValueError(
            f"{env_name}: make_scenarios returned a {type(scenarios).__name__}, not a list; {need}"
        )
    seen: set[str] = set()
    for i, sc in enumerate(scenarios):
        where = f"{env_name}: make_scenarios: scenario {i}"
        if not isinstance(sc, dict):
            raise ValueError(f"{where} is a {type(sc).__name__}, not a dict; {need}")
        where += f" ({sc['id']!r})" if "id" in sc else ""
        for key in ("id", "split", "prompt"):
            if key not in sc:
                raise ValueError(f"{where} has no {key!r}; {need}")
        if not isinstance(sc["id"], str) or not isinstance(sc["prompt"], str) or sc["split"] not in SPLITS:
            raise ValueError(
                f"{where}: id {sc['id']!r}, split {sc['split']!r}, prompt of type "
                f"{type(sc['prompt']).__name__}; {need}"
            )
        if sc["id"] in seen:
            raise ValueError(f"{where}: the id {sc['id']!r} is used twice; ids must be unique")
        seen.add(sc["id"])
    return scenarios


def run_grader(grade: Callable[[Any], Any], inputs: Any, env_name: str, scenario: Scenario) -> Grade:
    """`grade(inputs)` as a `Grade` (a float in [0, 1] is taken as the score); a `GraderError`,
    one line naming the environment, the grader and the scenario, when it raises or returns
    anything else."""
    where = f"{env_name}: grader {callable_name(grade, 'grade')}"
    try:
        result = grade(inputs)
    except Exception as exc:  # the author's grader: fails this rollout with a line that says so
        raise GraderError(
            f"{where} raised {type(exc).__name__}: {exc} (scenario {scenario.get('id')!r})"
        ) from exc
    if isinstance(result, Grade):
        return result
    if isinstance(result, int | float) and not isinstance(result, bool) and 0.0 <= result <= 1.0:
        return Grade(score=float(result))
    raise GraderError(
        f"{where} returned {result!r} (scenario {scenario.get('id')!r}); return a Grade or a float in [0, 1]"
    )


def _empty_answer(scenario: Scenario, call: Call) -> str:
    return ""


def _echo_prompt(scenario: Scenario, call: Call) -> str:
    """Repeat the request: whatever the prompt names (ids, limits) must not earn credit alone."""
    return f"{scenario['prompt']} Done: that is not possible, it has been handled and confirmed."


def _prove(env: SqliteEnvironment, scenario: Scenario, solver: Solver, who: str) -> tuple[Grade | None, str]:
    """(grade, "") for a solver's chat, or (None, what failed) when the solver or the grader raised."""
    episode = env.reset(scenario)
    try:
        try:
            traj = play(episode, solver, scenario)
        except Exception as exc:  # the author's solver: reported, and the validation goes on
            return None, f"{who} raised {type(exc).__name__}: {exc}"
        try:
            return episode.grade(traj), ""
        except GraderError as exc:
            return None, f"{exc}, on the chat of the {who}"
    finally:
        episode.close()


class LocalEpisode:
    """One rollout's session: opening messages, tools, and a private database."""

    def __init__(self, env: SqliteEnvironment, scenario: Scenario, state: SqliteState):
        self.env = env
        self.scenario = scenario
        self.state = state

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": self.env.spec.system_prompt},
            {"role": "user", "content": self.scenario["prompt"]},
        ]

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.env.toolbox.specs

    @property
    def done(self) -> bool:
        return self._counter("budget_exhausted") > 0

    def step(self, tool_call: Any) -> dict[str, Any]:
        try:
            call = parse_tool_call(tool_call)
        except TypeError as exc:
            return self._reply("", error_content("invalid_tool_call", str(exc)), "invalid_tool_call", 0.0)
        budget = self.env.limits.latency_budget_s
        cost = self.env.toolbox.latency(call.name)
        simulated = self.env.limits.clock == "simulated"
        if self.done or (budget is not None and simulated and self._counter("elapsed_s") + cost > budget):
            self._set("budget_exhausted", 1)
            text = f"latency budget of {budget} s is spent; give your final answer now"
            return self._reply(call.id, error_content("budget_exhausted", text), "budget_exhausted", 0.0)
        ctx = ToolContext(self.state, self.scenario, self.env.seed_db, int(self._counter("tool_calls")))
        t0 = time.perf_counter()
        outcome = self.env.toolbox.run(ctx, call)
        spent = outcome.latency_s if simulated else time.perf_counter() - t0
        reply = self._reply(call.id, outcome.content, outcome.error, spent)
        if budget is not None and self._counter("elapsed_s") >= budget:
            self._set("budget_exhausted", 1)
        return reply

    def _reply(self, call_id: str, content: str, error: str | None, spent: float) -> dict[str, Any]:
        with self.state.conn:
            self.state.conn.execute("UPDATE _episode SET value = value + ? WHERE key = 'elapsed_s'", (spent,))
            self.state.conn.execute("UPDATE _episode SET value = value + 1 WHERE key = 'tool_calls'")
            if error is not None:
                self.state.conn.execute("UPDATE _episode SET value = value + 1 WHERE key = 'tool_errors'")
                self.state.conn.execute(
                    "INSERT INTO _episode VALUES (?, 1) ON CONFLICT(key) DO UPDATE SET value = value + 1",
                    (f"error_{error}",),
                )
        return {"role": "tool", "tool_call_id": call_id, "content": content}

    def _counter(self, key: str) -> float:
        row = self.state.conn.execute("SELECT value FROM _episode WHERE key = ?", (key,)).fetchone()
        return float(row[0]) if row is not None else 0.0

    def _set(self, key: str, value: float) -> None:
        with self.state.conn:
            self.state.conn.execute("UPDATE _episode SET value = ? WHERE key = ?", (value, key))

    def grade(self, trajectory: Any) -> Grade:
        messages = as_messages(trajectory)
        inputs = GradeInput(
            scenario=self.scenario,
            state=self.state,
            seed=self.env.seed_db,
            messages=messages,
            answer=final_answer(messages),
            calls=tool_calls_made(messages),
        )
        return run_grader(self.env.spec.grade, inputs, self.env.name, self.scenario)

    def snapshot(self) -> bytes:
        return self.state.snapshot()

    def restore(self, data: bytes) -> None:
        """Restore a snapshot; bytes that are not an episode database leave the state as it was.

        The bytes must be an intact database with exactly the seed's schema (`check_snapshot`): a
        database with views or triggers of its own would run them on every tool call.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"restore expects the bytes of snapshot(), got {type(data).__name__}")
        try:
            check_snapshot(data, self.env.seed_db)
        except ValueError as exc:
            raise ValueError(f"not a snapshot of a {self.env.name} episode: {exc}") from None
        before = self.state.snapshot()
        try:
            self.state.restore(data)
            self.state.conn.execute("SELECT count(*) FROM _episode").fetchone()
        except sqlite3.DatabaseError as exc:
            self.state.restore(before)
            raise ValueError(f"not a snapshot of a {self.env.name} episode: {exc}") from None

    def fork(self) -> LocalEpisode:
        return LocalEpisode(self.env, self.scenario, self.state.fork())

    def metrics(self) -> dict[str, float]:
        rows = self.state.conn.execute("SELECT key, value FROM _episode").fetchall()
        return {f"env_{k}": float(v) for k, v in rows}

    def close(self) -> None:
        self.state.close()


def play(
    episode: Any,
    solver: Solver,
    scenario: Scenario,
    *,
    rng: random.Random | None = None,
    prefaces: Sequence[str] = ("",),
) -> Trajectory:
    """Run a scripted solver through an episode and return its chat as a `Trajectory`.

    Each call becomes an assistant message with one tool call and the episode's tool reply, in
    the OpenAI format a model's rollout produces, so graders see scripted and sampled
    trajectories the same way. `rng` and `prefaces` vary the wording (see `Call`).
    """
    traj = Trajectory(messages=list(episode.messages), tools=episode.tools)
    answer = solver(scenario, Call(episode, traj.messages, rng, prefaces))
    traj.messages.append({"role": "assistant", "content": answer})
    return traj


SCENARIOS = 100
"""Train and validation scenarios of a built-in environment (80 and 20)."""
TEST_SCENARIOS = 100
"""Test scenarios of a built-in environment, generated after the first `SCENARIOS` by the same
seeded draw, so adding them left the train and validation scenarios as they were."""


def assign_splits(
    env_name: str, scenarios: list[Scenario], validation_every: int = 5, test_from: int | None = None
) -> list[Scenario]:
    """Give each scenario an id and a split: from index `test_from` on, test; before it, every
    `validation_every`-th one is validation and the rest train.

    Scenarios are generated in a seeded random order, so this is a seeded random 80/20 split
    that never changes for a given seed (a validation score stays comparable across runs).
    """
    out = []
    for i, sc in enumerate(scenarios):
        if test_from is not None and i >= test_from:
            split = "test"
        else:
            split = "validation" if i % validation_every == validation_every - 1 else "train"
        out.append({"id": f"{env_name}-{i:03d}", "env": env_name, "split": split, **sc})
    return out
