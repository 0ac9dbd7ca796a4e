"""Graders on hand-written good and bad trajectories, with hand-computed scores, and validate()."""

from __future__ import annotations

import json

import pytest

from grooves.core.trajectory import Trajectory
from grooves.envs import BUILTINS, get_env
from grooves.envs.builtin.answers import money


@pytest.fixture(scope="module")
def envs():
    return {name: get_env(name) for name in BUILTINS}


def first(env, **want):
    """The first scenario (train or validation) whose `expected` has all of `want`."""
    for sc in env.scenarios("train") + env.scenarios("validation"):
        if all(sc["expected"].get(k) == v for k, v in want.items()):
            return sc
    raise LookupError(f"no {env.name} scenario with {want}")


def act(env, scenario, steps, answer):
    """Run hand-written tool calls on a fresh episode, end with `answer`, and grade the chat."""
    episode = env.reset(scenario)
    messages = list(episode.messages)
    results = []
    for i, (name, args) in enumerate(steps):
        tool_call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call]})
        messages.append(episode.step(tool_call))
        results.append(json.loads(messages[-1]["content"]))
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    grade = episode.grade(Trajectory(messages=messages))
    episode.close()
    return grade, results


@pytest.mark.parametrize("name", BUILTINS)
def test_validate_proves_each_grader(envs, name):
    report = envs[name].validate()
    assert report.ok, report.failures[:5]
    assert report.scenarios == 200  # train, validation and test
    assert min(report.gold_scores) == 1.0
    assert max(report.bad_scores) <= 0.5
    assert len(report.bad_scores) >= 3 * report.scenarios  # the empty answer plus two bad solvers each


def test_environments_are_deterministic_in_their_seed():
    a, b, c = (
        get_env("flight_booking", seed=0),
        get_env("flight_booking", seed=0),
        get_env("flight_booking", seed=1),
    )
    assert a.scenarios("validation") == b.scenarios("validation")
    assert a.seed_db.serialize() == b.seed_db.serialize()
    assert a.scenarios("validation") != c.scenarios("validation")
    assert len(a.scenarios("train")) == 80 and len(a.scenarios("validation")) == 20


@pytest.mark.parametrize("name", BUILTINS)
def test_the_test_split_is_held_out_and_left_the_other_splits_as_they_were(envs, name):
    """100 test scenarios, none asking what a train or validation scenario asks; the first 100
    scenarios (train and validation) are the ones drawn before the test split existed."""
    from grooves.envs.sqlite import SCENARIOS

    env = envs[name]
    train, validation, test = (env.scenarios(s) for s in ("train", "validation", "test"))
    assert len(test) == 100
    assert [s["id"] for s in test] == [f"{name}-{i:03d}" for i in range(100, 200)]
    assert {s["split"] for s in test} == {"test"}
    assert not {s["prompt"] for s in test} & {s["prompt"] for s in train + validation}
    assert len({s["prompt"] for s in test}) == 100
    # the draw of SCENARIOS alone, as before the test split: the same scenarios in the same splits
    alone = env.spec.make_scenarios(env.seed_db.connection, env.data_seed, count=SCENARIOS)
    assert [s for s in alone if s["split"] == "train"] == train
    assert [s for s in alone if s["split"] == "validation"] == validation


def test_support_desk_refund(envs):
    env = envs["support_desk"]
    sc = first(env, kind="refund", action="refund")
    oid, amount = sc["expected"]["order_id"], sc["expected"]["amount_cents"]
    refund = [("refund_order", {"order_id": oid, "reason": "customer request"})]
    good, results = act(env, sc, refund, f"I refunded order {oid}; {money(amount)} is on its way back.")
    assert results[0]["amount"] == money(amount)
    assert good.score == 1.0 and good.parts == {"policy": 1.0, "truthful": 1.0, "action": 1.0, "answer": 1.0}
    vague, _ = act(env, sc, refund, f"Order {oid} is sorted.")
    assert vague.score == pytest.approx(0.6)
    claimed, _ = act(env, sc, [], f"Order {oid} has been refunded: {money(amount)}.")
    assert claimed.score == 0.0 and claimed.parts["truthful"] == 0.0
    wrong_remedy, _ = act(
        env,
        sc,
        [("replace_order", {"order_id": oid, "reason": "x"})],
        f"I refunded order {oid}: {money(amount)}.",
    )
    assert wrong_remedy.score <= 0.4
    empty, _ = act(env, sc, [], "")
    assert empty.score == 0.0


def test_support_desk_decline_and_question(envs):
    env = envs["support_desk"]
    sc = first(env, kind="refund", action="none", reason="window")
    oid = sc["expected"]["order_id"]
    good, _ = act(
        env, sc, [], f"Sorry, order {oid} is outside the 30 days refund window, so I can't refund it."
    )
    assert good.score == 1.0
    no_reason, _ = act(env, sc, [], f"I can't help with order {oid}.")
    assert no_reason.score == pytest.approx(0.4)
    out_of_policy, _ = act(
        env,
        sc,
        [("refund_order", {"order_id": oid, "reason": "nice customer"})],
        f"Order {oid} is outside the window, but I refunded it anyway.",
    )
    assert out_of_policy.score == 0.0 and out_of_policy.parts["policy"] == 0.0
    q = first(env, kind="question", field="stock")
    n = q["expected"]["number"]
    look = [("get_product", {"product_id": q["expected"]["product_id"]})]
    assert act(env, q, look, f"We have {n} in stock.")[0].score == 1.0
    assert act(env, q, look, f"We have {n + 1} in stock.")[0].score == 0.0
    assert act(env, q, look, f"Somewhere between {n}, {n + 1} and {n + 2}.")[0].score == 0.0
    assert act(env, q, [], f"We have {n} in stock.")[0].score == 0.0  # a lucky guess without looking


def test_support_desk_answer_inside_a_tool_call_turn_is_not_an_answer(envs):
    env = envs["support_desk"]
    q = first(env, kind="question", field="warranty_days")
    episode = env.reset(q)
    stray = {
        "id": "c",
        "type": "function",
        "function": {"name": "get_product", "arguments": '{"product_id": "P01"}'},
    }
    messages = [
        *episode.messages,
        {"role": "assistant", "content": f"{q['expected']['number']} days", "tool_calls": [stray]},
        episode.step(stray),
    ]
    assert episode.grade(messages).score == 0.0


def test_issue_tracker_reassign(envs):
    env = envs["issue_tracker"]
    sc = first(env, kind="reassign")
    key, uid, prio = sc["expected"]["key"], sc["expected"]["assignee"], sc["expected"]["priority"]
    both = [("update_issue", {"key": key, "assignee": uid, "priority": prio})]
    assert act(env, sc, both, f"{key} reassigned.")[0].score == 1.0
    half, _ = act(env, sc, [("update_issue", {"key": key, "assignee": uid})], f"{key} reassigned.")
    assert half.score == pytest.approx(0.8 * 0.5 + 0.2)
    other = "WEB-1" if key != "WEB-1" else "WEB-2"
    collateral, _ = act(env, sc, [*both, ("update_issue", {"key": other, "priority": "low"})], f"{key} done.")
    assert collateral.score == 0.0 and collateral.parts["collateral"] == 0.0
    assert act(env, sc, [], f"{key} reassigned.")[0].score == pytest.approx(0.2)


def test_issue_tracker_file_blocker_and_close(envs):
    env = envs["issue_tracker"]
    sc = first(env, kind="file_blocker")
    e = sc["expected"]
    create = (
        "create_issue",
        {"project": e["project"], "title": e["title"], "type": e["type"], "priority": e["priority"]},
    )
    good, results = act(env, sc, [create], None)
    new_key = results[0]["created"]
    steps = [create, ("link_issues", {"from_key": new_key, "kind": "blocks", "to_key": e["key"]})]
    assert act(env, sc, steps, f"Filed {new_key}, blocking {e['key']}.")[0].score == 1.0
    wrong_priority = [
        (create[0], create[1] | {"priority": "low" if e["priority"] != "low" else "high"}),
        steps[1],
    ]
    assert act(env, sc, wrong_priority, f"Filed {new_key}.")[0].score == pytest.approx(0.8 * 0.75 + 0.2)
    close = first(env, kind="close")
    key = close["expected"]["key"]
    status = env.seed_db.connection.execute("SELECT status FROM issues WHERE key = ?", (key,)).fetchone()[0]
    path = {
        "todo": ["in_progress", "in_review", "done"],
        "in_progress": ["in_review", "done"],
        "in_review": ["done"],
    }[status]
    walk = [("transition_issue", {"key": key, "status": s}) for s in path]
    assert act(env, close, walk, f"{key} is done.")[0].score == 1.0
    jump, results = act(env, close, [("transition_issue", {"key": key, "status": "done"})], f"{key} is done.")
    if status != "in_review":
        assert results[0]["error"] == "refused"
        assert jump.score == pytest.approx(0.2)


def test_flight_booking_book_and_change(envs):
    env = envs["flight_booking"]
    sc = first(env, kind="cheapest")
    e = sc["expected"]
    _, held = act(
        env, sc, [("hold_seat", {"flight_id": e["flight_id"], "passenger_id": e["passenger_id"]})], None
    )
    bid = held[0]["held"]
    book = [
        ("hold_seat", {"flight_id": e["flight_id"], "passenger_id": e["passenger_id"]}),
        ("confirm_booking", {"booking_id": bid}),
    ]
    assert act(env, sc, book, f"Booked: {bid}.")[0].score == 1.0
    origin, dest, day = e["route"]
    other = env.seed_db.connection.execute(
        "SELECT id FROM flights WHERE origin = ? AND destination = ? AND day = ? AND id != ? AND seats_left > 0",
        (origin, dest, day, e["flight_id"]),
    ).fetchone()[0]
    stray_hold = [*book, ("hold_seat", {"flight_id": other, "passenger_id": e["passenger_id"]})]
    leaky, _ = act(env, sc, stray_hold, f"Booked: {bid}.")
    assert leaky.score == pytest.approx(0.8) and leaky.parts["clean"] == 0.0
    wrong = [
        ("hold_seat", {"flight_id": other, "passenger_id": e["passenger_id"]}),
        ("confirm_booking", {"booking_id": bid}),
    ]
    assert act(env, sc, wrong, f"Booked: {bid}.")[0].score == 0.0

    change = first(env, kind="change", reason=None)
    c = change["expected"]
    moved, results = act(
        env,
        change,
        [
            ("quote_change", {"booking_id": c["booking_id"], "new_flight_id": c["flight_id"]}),
            ("change_booking", {"booking_id": c["booking_id"], "new_flight_id": c["flight_id"]}),
        ],
        f"Booking {c['booking_id']} moved.",
    )
    assert results[0]["change_cost"] == results[1]["charged"]
    assert moved.score == 1.0
    assert (
        act(env, change, [], f"Booking {c['booking_id']} moved.")[0].score == 0.0
    )  # the id is in the prompt
    basic = first(env, kind="change", reason="basic")
    bb = basic["expected"]["booking_id"]
    _, refused = act(env, basic, [("quote_change", {"booking_id": bb, "new_flight_id": "GR101"})], None)
    assert refused[0]["error"] == "refused"
    look = [("get_booking", {"booking_id": bb})]
    assert act(env, basic, look, f"Booking {bb} is a basic fare and cannot be changed.")[0].score == 1.0
    assert act(env, basic, look, f"Booking {bb} was changed.")[0].score == pytest.approx(0.4)
    blind, _ = act(env, basic, [], f"Booking {bb} is a basic fare and cannot be changed.")
    assert blind.score == 0.0 and blind.parts["checked"] == 0.0  # parroting the prompt earns nothing


def test_corpus_search_answers(envs):
    env = envs["corpus_search"]
    sc = first(env, kind="town_founded")
    year, doc = sc["expected"]["answer"], sc["expected"]["doc_id"]
    assert act(env, sc, [], f"{year} [{doc}]")[0].score == 1.0
    assert act(env, sc, [], f"It was founded in {year}.")[0].score == pytest.approx(0.8)
    assert act(env, sc, [], f"{year} or {year + 40} [{doc}]")[0].score == 0.0
    assert act(env, sc, [], f"[{doc}]")[0].score == 0.0
    assert act(env, sc, [], "")[0].score == 0.0
    founder = first(env, kind="company_founder")
    name, doc = founder["expected"]["answer"], founder["expected"]["doc_id"]
    assert act(env, founder, [], f"{name} founded it [{doc}].")[0].score == 1.0
    other = founder["expected"]["wrong"][0]
    assert act(env, founder, [], f"{name} or {other} [{doc}]")[0].score == 0.0
    alike = next(
        s
        for s in env.scenarios("train")
        if s["expected"]["kind"].startswith("town") and s["expected"]["wrong"]
    )
    lookalike_value = alike["expected"]["wrong"][0]
    assert act(env, alike, [], f"{lookalike_value} [{alike['expected']['doc_id']}]")[0].score == 0.0
