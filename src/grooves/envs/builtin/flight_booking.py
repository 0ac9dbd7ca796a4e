"""Flight booking: search, hold, confirm and change flights within fare rules.

Booking is two steps, as in real reservation systems: a hold takes a seat, a confirmation pays
for it, and holds the agent abandons are left on the books (the grader notices). Changes follow
fare rules the change tool enforces (basic fares cannot change; standard pays a fee plus any fare
difference; flex pays only the difference), but whether a change is worth it to the traveller
(their cost limit) is the agent's decision, checked on the final database.
"""

from __future__ import annotations

import random
import sqlite3
from typing import Any, cast

from grooves.envs.base import Grade, Limits, Scenario
from grooves.envs.builtin.answers import mentions, mentions_any, money
from grooves.envs.sqlite import SCENARIOS, TEST_SCENARIOS, Call, EnvSpec, GradeInput, Solver, assign_splits
from grooves.envs.state import changed_keys
from grooves.envs.tools import Tool, ToolContext, ToolError, integer, obj, string

AIRPORTS = {
    "BOS": "Boston",
    "DEN": "Denver",
    "SFO": "San Francisco",
    "ORD": "Chicago",
    "SEA": "Seattle",
    "AUS": "Austin",
    "JFK": "New York",
    "MIA": "Miami",
}
CHANGE_FEE_CENTS = {"basic": None, "standard": 7500, "flex": 0}
DAYS = range(1, 15)

SYSTEM = (
    "You are a travel agent with access to an airline's reservation system. Airports are given by "
    "code (list_airports maps cities to codes). To book: hold a seat, then confirm the hold; release "
    "any hold you do not confirm. Fare rules for changes: basic fares cannot be changed; standard "
    f"fares pay a {money(cast(int, CHANGE_FEE_CENTS['standard']))} fee plus any increase in fare; flex fares pay "
    "only the increase. Quote a change before making it and respect the traveller's cost limit. "
    "Finish with a short answer naming the booking id."
)

_FIRST = ["Alma", "Bao", "Cyrus", "Dina", "Eero", "Fatou", "Gus", "Hira", "Ilse", "Jalen", "Keiko", "Lior"]
_LAST = ["Abbott", "Bjork", "Castillo", "Dubois", "Eze", "Fontaine", "Grieg", "Hossain", "Ito", "Jovanovic"]

_SCHEMA = """
CREATE TABLE airports (code TEXT PRIMARY KEY, city TEXT NOT NULL);
CREATE TABLE flights (id TEXT PRIMARY KEY, origin TEXT NOT NULL REFERENCES airports(code),
  destination TEXT NOT NULL REFERENCES airports(code), day INTEGER NOT NULL, depart TEXT NOT NULL,
  arrive TEXT NOT NULL, fare_class TEXT NOT NULL, price_cents INTEGER NOT NULL, seats_left INTEGER NOT NULL);
CREATE INDEX flights_by_route ON flights(origin, destination, day);
CREATE TABLE passengers (id TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT UNIQUE NOT NULL);
CREATE TABLE bookings (id TEXT PRIMARY KEY, passenger_id TEXT NOT NULL REFERENCES passengers(id),
  flight_id TEXT NOT NULL REFERENCES flights(id), status TEXT NOT NULL, fare_paid_cents INTEGER NOT NULL);
CREATE TABLE charges (id INTEGER PRIMARY KEY, booking_id TEXT NOT NULL REFERENCES bookings(id),
  amount_cents INTEGER NOT NULL, what TEXT NOT NULL);
"""


def build_seed(conn: sqlite3.Connection, seed: int) -> None:
    """16 routes x 14 days x 3-4 flights, 80 passengers, 150 confirmed bookings; all from `seed`."""
    rng = random.Random(f"flight_booking:{seed}")
    conn.executescript(_SCHEMA)
    conn.executemany("INSERT INTO airports VALUES (?,?)", list(AIRPORTS.items()))
    codes = list(AIRPORTS)
    routes = rng.sample([(a, b) for a in codes for b in codes if a != b], 16)
    flights, n = [], 100
    for origin, dest in routes:
        hours = rng.randint(2, 5)
        for day in DAYS:
            for dep in sorted(rng.sample(range(6, 22), rng.randint(3, 4))):
                n += 1
                fare = rng.choice(list(CHANGE_FEE_CENTS))
                price = rng.randrange(9000, 60000, 500) + {"basic": 0, "standard": 4000, "flex": 12000}[fare]
                seats = rng.choice([0, 1, 2, 4, 7, 9])
                flights.append(
                    (
                        f"GR{n}",
                        origin,
                        dest,
                        day,
                        f"{dep:02d}:{rng.choice(['00', '30'])}",
                        f"{(dep + hours) % 24:02d}:15",
                        fare,
                        price,
                        seats,
                    )
                )
    conn.executemany("INSERT INTO flights VALUES (?,?,?,?,?,?,?,?,?)", flights)
    people = [(f"PS{i:03d}", f"{rng.choice(_FIRST)} {rng.choice(_LAST)}") for i in range(1, 81)]
    conn.executemany(
        "INSERT INTO passengers VALUES (?,?,?)",
        [(pid, nm, f"{nm.lower().replace(' ', '.')}.{pid[2:]}@example.com") for pid, nm in people],
    )
    for i in range(1001, 1151):
        flight = rng.choice(flights)
        conn.execute(
            "INSERT INTO bookings VALUES (?,?,?,?,?)",
            (f"BK{i}", rng.choice(people)[0], flight[0], "booked", flight[7]),
        )
        conn.execute(
            "INSERT INTO charges (booking_id, amount_cents, what) VALUES (?,?,?)",
            (f"BK{i}", flight[7], "fare"),
        )


def change_cost(fare_class: str, fare_paid: int, new_price: int) -> int | None:
    """What a change costs under the fare rules, or None when the fare cannot change."""
    fee = CHANGE_FEE_CENTS[fare_class]
    return None if fee is None else fee + max(0, new_price - fare_paid)


# ---- tools -------------------------------------------------------------------------------------


def _flight(ctx: ToolContext, flight_id: str) -> dict[str, Any]:
    row = ctx.state.one("SELECT * FROM flights WHERE id = ?", (flight_id.strip().upper(),))
    if row is None:
        raise ToolError(f"no flight {flight_id!r}")
    return row


def _booking(ctx: ToolContext, booking_id: str) -> dict[str, Any]:
    row = ctx.state.one(
        """SELECT b.*, f.origin, f.destination, f.day, f.depart, f.fare_class FROM bookings b
                           JOIN flights f ON f.id = b.flight_id WHERE b.id = ?""",
        (booking_id.strip().upper(),),
    )
    if row is None:
        raise ToolError(f"no booking {booking_id!r}")
    return row


def _show(row: dict[str, Any]) -> dict[str, Any]:
    """Amounts as dollars for the agent: `price_cents: 12300` becomes `price: "$123.00"`."""
    return {(k.removesuffix("_cents")): (money(v) if k.endswith("_cents") else v) for k, v in row.items()}


def _airports(ctx: ToolContext, a: dict[str, Any]) -> Any:
    return {"airports": ctx.state.query("SELECT code, city FROM airports ORDER BY code")}


def _search(ctx: ToolContext, a: dict[str, Any]) -> Any:
    rows = ctx.state.query(
        "SELECT * FROM flights WHERE origin = ? AND destination = ? AND day = ? ORDER BY depart",
        (a["origin"].upper(), a["destination"].upper(), a["day"]),
    )
    return {"flights": [_show(r) for r in rows]}


def _passenger(ctx: ToolContext, a: dict[str, Any]) -> Any:
    row = ctx.state.one("SELECT * FROM passengers WHERE email = ?", (a["email"].strip().lower(),))
    if row is None:
        raise ToolError(f"no passenger with email {a['email']!r}")
    row["bookings"] = [
        r["id"] for r in ctx.state.query("SELECT id FROM bookings WHERE passenger_id = ?", (row["id"],))
    ]
    return row


def _get_booking(ctx: ToolContext, a: dict[str, Any]) -> Any:
    return _show(_booking(ctx, a["booking_id"]))


def _hold(ctx: ToolContext, a: dict[str, Any]) -> Any:
    flight = _flight(ctx, a["flight_id"])
    if ctx.state.one("SELECT id FROM passengers WHERE id = ?", (a["passenger_id"],)) is None:
        raise ToolError(f"no passenger {a['passenger_id']!r}")
    if flight["seats_left"] < 1:
        raise ToolError(f"{flight['id']} is full")
    with ctx.state.conn:
        n = ctx.state.conn.execute("SELECT count(*) FROM bookings").fetchone()[0]
        bid = f"BK{1001 + n}"
        ctx.state.conn.execute(
            "INSERT INTO bookings VALUES (?,?,?,?,?)",
            (bid, a["passenger_id"], flight["id"], "held", flight["price_cents"]),
        )
        ctx.state.conn.execute("UPDATE flights SET seats_left = seats_left - 1 WHERE id = ?", (flight["id"],))
    return {"held": bid, "flight_id": flight["id"], "fare": money(flight["price_cents"])}


def _held(ctx: ToolContext, booking_id: str) -> dict[str, Any]:
    b = _booking(ctx, booking_id)
    if b["status"] != "held":
        raise ToolError(f"{b['id']} is {b['status']}, not held")
    return b


def _confirm(ctx: ToolContext, a: dict[str, Any]) -> Any:
    b = _held(ctx, a["booking_id"])
    with ctx.state.conn:
        ctx.state.conn.execute("UPDATE bookings SET status = 'booked' WHERE id = ?", (b["id"],))
        ctx.state.conn.execute(
            "INSERT INTO charges (booking_id, amount_cents, what) VALUES (?,?,?)",
            (b["id"], b["fare_paid_cents"], "fare"),
        )
    return {"booked": b["id"], "charged": money(b["fare_paid_cents"])}


def _release(ctx: ToolContext, a: dict[str, Any]) -> Any:
    b = _held(ctx, a["booking_id"])
    with ctx.state.conn:
        ctx.state.conn.execute("UPDATE bookings SET status = 'released' WHERE id = ?", (b["id"],))
        ctx.state.conn.execute(
            "UPDATE flights SET seats_left = seats_left + 1 WHERE id = ?", (b["flight_id"],)
        )
    return {"released": b["id"]}


def _quote_or_fail(ctx: ToolContext, a: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], int]:
    b, f = _booking(ctx, a["booking_id"]), _flight(ctx, a["new_flight_id"])
    if b["status"] != "booked":
        raise ToolError(f"{b['id']} is {b['status']}; only confirmed bookings can change")
    if (f["origin"], f["destination"]) != (b["origin"], b["destination"]):
        raise ToolError(f"{f['id']} flies {f['origin']}-{f['destination']}, not the booked route")
    if f["seats_left"] < 1:
        raise ToolError(f"{f['id']} is full")
    cost = change_cost(b["fare_class"], b["fare_paid_cents"], f["price_cents"])
    if cost is None:
        raise ToolError(f"{b['id']} is a basic fare: basic fares cannot be changed")
    return b, f, cost


def _quote(ctx: ToolContext, a: dict[str, Any]) -> Any:
    b, f, cost = _quote_or_fail(ctx, a)
    return {"booking_id": b["id"], "new_flight_id": f["id"], "change_cost": money(cost)}


def _change(ctx: ToolContext, a: dict[str, Any]) -> Any:
    b, f, cost = _quote_or_fail(ctx, a)
    with ctx.state.conn:
        ctx.state.conn.execute(
            "UPDATE bookings SET flight_id = ?, fare_paid_cents = max(fare_paid_cents, ?) WHERE id = ?",
            (f["id"], f["price_cents"], b["id"]),
        )
        ctx.state.conn.execute(
            "UPDATE flights SET seats_left = seats_left + 1 WHERE id = ?", (b["flight_id"],)
        )
        ctx.state.conn.execute("UPDATE flights SET seats_left = seats_left - 1 WHERE id = ?", (f["id"],))
        ctx.state.conn.execute(
            "INSERT INTO charges (booking_id, amount_cents, what) VALUES (?,?,?)", (b["id"], cost, "change")
        )
    return {"changed": b["id"], "new_flight_id": f["id"], "charged": money(cost)}


_BK = {"booking_id": string("booking id, e.g. BK1042", 10)}
_NEW = {"new_flight_id": string("flight id, e.g. GR245", 8)}
_CODE = string("airport code", 3)
TOOLS = [
    Tool("list_airports", "All airports with their cities.", obj({}), _airports, latency_s=0.1),
    Tool(
        "search_flights",
        "Flights on a route and day, by departure time.",
        obj(
            {"origin": _CODE, "destination": _CODE, "day": integer("day number", 1, 14)},
            ["origin", "destination", "day"],
        ),
        _search,
        latency_s=0.8,
    ),
    Tool(
        "find_passenger",
        "A passenger by email, with their booking ids.",
        obj({"email": string("email", 120)}, ["email"]),
        _passenger,
    ),
    Tool("get_booking", "A booking with its flight and fare class.", obj(_BK, ["booking_id"]), _get_booking),
    Tool(
        "hold_seat",
        "Hold a seat on a flight for a passenger (not paid until confirmed).",
        obj(
            {"flight_id": string("flight id", 8), "passenger_id": string("passenger id, e.g. PS007", 6)},
            ["flight_id", "passenger_id"],
        ),
        _hold,
        latency_s=0.5,
    ),
    Tool("confirm_booking", "Pay for a held seat.", obj(_BK, ["booking_id"]), _confirm, latency_s=0.5),
    Tool("release_hold", "Give up a held seat.", obj(_BK, ["booking_id"]), _release),
    Tool(
        "quote_change",
        "What moving a booking to another flight would cost.",
        obj(_BK | _NEW, list(_BK | _NEW)),
        _quote,
    ),
    Tool(
        "change_booking",
        "Move a confirmed booking to another flight on its route, charging the cost.",
        obj(_BK | _NEW, list(_BK | _NEW)),
        _change,
        latency_s=0.5,
    ),
]

# ---- scenarios ---------------------------------------------------------------------------------


def _options(conn: sqlite3.Connection, origin: str, dest: str, day: int) -> list[tuple[str, str, int]]:
    return conn.execute(
        """SELECT id, depart, price_cents FROM flights WHERE origin = ? AND destination = ?
                           AND day = ? AND seats_left > 0 ORDER BY depart""",
        (origin, dest, day),
    ).fetchall()


def _cheapest(options: list[tuple[str, str, int]]) -> str | None:
    prices = sorted(o[2] for o in options)
    if not prices or (len(prices) > 1 and prices[0] == prices[1]):
        return None  # no unique answer
    return min(options, key=lambda o: o[2])[0]


def make_scenarios(
    conn: sqlite3.Connection, seed: int, count: int = SCENARIOS + TEST_SCENARIOS
) -> list[Scenario]:
    """Book-the-cheapest, book-the-earliest, and change requests with a cost limit."""
    rng = random.Random(f"flight_booking:scenarios:{seed}")
    routes = conn.execute("SELECT DISTINCT origin, destination FROM flights ORDER BY 1, 2").fetchall()
    people = conn.execute("SELECT id, name, email FROM passengers ORDER BY id").fetchall()
    bookings = conn.execute("""SELECT b.id, p.name, p.email, f.origin, f.destination, f.day, f.fare_class,
                               b.fare_paid_cents FROM bookings b JOIN passengers p ON p.id = b.passenger_id
                               JOIN flights f ON f.id = b.flight_id ORDER BY b.id""").fetchall()
    out: list[Scenario] = []
    while len(out) < count:  # distinct requests: none in validation or test is also a train request
        kind = rng.choice(["cheapest", "earliest", "change"])
        if kind == "change":
            bid, name, email, origin, dest, day, fare, paid = rng.choice(bookings)
            new_day = rng.choice([d for d in DAYS if d != day])
            target = _cheapest(_options(conn, origin, dest, new_day))
            if target is None:
                continue
            price = conn.execute("SELECT price_cents FROM flights WHERE id = ?", (target,)).fetchone()[0]
            cost = change_cost(fare, paid, price)
            limit = rng.choice([5000, 10000, 20000, 40000])
            reason = "basic" if cost is None else ("cost" if cost > limit else None)
            prompt = (
                f"This is {name} ({email}). Please move my booking {bid} to day {new_day}, same route, on the "
                f"cheapest flight that day, but only if the change costs at most {money(limit)} in total."
            )
            exp = {"booking_id": bid, "flight_id": target if reason is None else None, "reason": reason}
        else:
            pid, name, email = rng.choice(people)
            origin, dest = rng.choice(routes)
            day = rng.choice(list(DAYS))
            options = _options(conn, origin, dest, day)
            target = _cheapest(options) if kind == "cheapest" else (options[0][0] if options else None)
            if target is None:
                continue
            what = "the cheapest flight" if kind == "cheapest" else "the earliest flight with a free seat"
            prompt = (
                f"Hi, I'm {name} ({email}). Book me {what} from {AIRPORTS[origin]} to {AIRPORTS[dest]} "
                f"on day {day}, please."
            )
            exp = {"passenger_id": pid, "flight_id": target, "route": [origin, dest, day]}
        if any(sc["prompt"] == prompt for sc in out):
            continue
        out.append({"prompt": prompt, "email": email, "expected": {"kind": kind, **exp}})
    return assign_splits("flight_booking", out, test_from=SCENARIOS)


# ---- grader ------------------------------------------------------------------------------------


def grade(g: GradeInput) -> Grade:
    """Bookings: 0.6 right flight confirmed + 0.2 no stray holds + 0.2 answer names it.
    Changes: like a booking when allowed; when not, gated on having looked the booking up,
    0.4 untouched + named, 0.6 reason given.
    Any change to another traveller's booking zeroes the score."""
    exp, before, after = g.scenario["expected"], g.seed.connection, g.state.conn
    changed = changed_keys(before, after, "bookings", "id")
    rows = {
        k: after.execute("SELECT passenger_id, flight_id, status FROM bookings WHERE id = ?", (k,)).fetchone()
        for k in changed
    }
    notes: list[str] = []
    if exp["kind"] == "change":
        bid = exp["booking_id"]
        stray = sorted(changed - {bid})
        if exp["flight_id"] is not None:
            ok = rows.get(bid) is not None and rows[bid][1] == exp["flight_id"]
            # The booking id is in the prompt: naming it earns credit only once the change is made.
            parts = {
                "booking": float(ok),
                "clean": float(ok and not stray),
                "answer": float(ok and mentions(g.answer, bid)),
            }
            score = 0.6 * parts["booking"] + 0.2 * parts["clean"] + 0.2 * parts["answer"]
        else:
            words = (
                ["basic"]
                if exp["reason"] == "basic"
                else ["cost", "more than", "exceed", "limit", "expensive"]
            )
            # The prompt names the booking and the limit, so a blind refusal could parrot both:
            # a decline only counts after the agent looked the booking up or quoted the change.
            checked = any(
                name in ("get_booking", "quote_change") and str(args.get("booking_id", "")).upper() == bid
                for name, args in g.calls
            )
            parts = {
                "checked": float(checked),
                "booking": float(bid not in changed and mentions(g.answer, bid)),
                "clean": float(not stray),
                "answer": float(mentions_any(g.answer, words)),
            }
            score = parts["checked"] * (0.4 * parts["booking"] + 0.6 * parts["answer"])
    else:
        mine = [k for k, r in rows.items() if r is not None and r[0] == exp["passenger_id"]]
        booked = [k for k in mine if rows[k][2] == "booked"]
        holds = [k for k in mine if rows[k][2] == "held"]
        stray = sorted(set(changed) - set(mine))
        ok = len(booked) == 1 and rows[booked[0]][1] == exp["flight_id"]
        parts = {
            "booking": float(ok),
            "clean": float(ok and not holds),
            "answer": float(ok and mentions(g.answer, booked[0])),
        }
        score = 0.6 * parts["booking"] + 0.2 * parts["clean"] + 0.2 * parts["answer"]
        if holds:
            notes.append(f"holds left behind: {holds}")
    parts["others_untouched"] = 0.0 if stray else 1.0
    notes += [f"changed another booking: {s}" for s in stray] + [
        f"{k} not met" for k, v in parts.items() if v < 1
    ]
    return Grade(score=score * parts["others_untouched"], parts=parts, notes=notes)


# ---- scripted solvers --------------------------------------------------------------------------


def gold(sc: Scenario, call: Call) -> str:
    """Map cities to codes, search, pick by the request, hold and confirm; quote before changing.
    Every id and code it passes to a tool was shown to it first (in the request or a tool result)."""
    exp = sc["expected"]
    me = call("find_passenger", {"email": sc["email"]})
    if exp["kind"] == "change":
        b = call("get_booking", {"booking_id": exp["booking_id"]})
        day = int(sc["prompt"].split(" to day ")[1].split(",")[0])
        flights = call(
            "search_flights", {"origin": b["origin"], "destination": b["destination"], "day": day}
        )["flights"]
        best = min((f for f in flights if f["seats_left"] > 0), key=lambda f: _dollars(f["price"]))
        quote = call("quote_change", {"booking_id": b["id"], "new_flight_id": best["id"]})
        limit = sc["prompt"].rsplit("at most ", 1)[1].split(" in total")[0]
        if "error" in quote:
            return call.say(
                f"Sorry, booking {b['id']} is a basic fare and cannot be changed.",
                f"Booking {b['id']} cannot be moved: basic fares cannot be changed.",
            )
        if _dollars(quote["change_cost"]) > _dollars(limit):
            return call.say(
                f"Moving booking {b['id']} would cost {quote['change_cost']}, more than your limit of {limit}.",
                f"I did not change booking {b['id']}: the change costs {quote['change_cost']}, over your limit of {limit}.",
            )
        call("change_booking", {"booking_id": b["id"], "new_flight_id": best["id"]})
        return call.say(
            f"Booking {b['id']} is now on {best['id']} for {quote['change_cost']}.",
            f"Done: booking {b['id']} moved to flight {best['id']}, costing {quote['change_cost']}.",
        )
    codes = {a["city"]: a["code"] for a in call("list_airports", {})["airports"]}
    cities = sc["prompt"].split(" from ", 1)[1].split(" on day ", 1)[0].split(" to ")
    origin, dest, day = codes[cities[0]], codes[cities[1]], exp["route"][2]
    assert [origin, dest] == exp["route"][:2], (
        f"the request names {cities}, the scenario flies {exp['route']}"
    )
    flights = [
        f
        for f in call("search_flights", {"origin": origin, "destination": dest, "day": day})["flights"]
        if f["seats_left"] > 0
    ]
    pick = min(flights, key=lambda f: _dollars(f["price"])) if exp["kind"] == "cheapest" else flights[0]
    held = call("hold_seat", {"flight_id": pick["id"], "passenger_id": me["id"]})
    call("confirm_booking", {"booking_id": held["held"]})
    return call.say(
        f"You're booked on {pick['id']}: booking {held['held']}.",
        f"Booked: flight {pick['id']}, booking {held['held']}.",
        f"Your booking {held['held']} on flight {pick['id']} is confirmed.",
    )


def _dollars(text: str) -> float:
    return float(text.strip("$").replace(",", ""))


def bad(sc: Scenario) -> list[Solver]:
    """An agent that books the first flight listed and forgets a hold; one that only claims success."""
    exp = sc["expected"]

    def sloppy(s: Scenario, call: Call) -> str:
        me = call("find_passenger", {"email": s["email"]})
        if exp["kind"] == "change":
            b = call("get_booking", {"booking_id": exp["booking_id"]})
            day = b["day"] % 14 + 1
            other = call(
                "search_flights", {"origin": b["origin"], "destination": b["destination"], "day": day}
            )
            call("change_booking", {"booking_id": b["id"], "new_flight_id": other["flights"][-1]["id"]})
            return f"Changed {b['id']}."
        origin, dest, day = exp["route"]
        flights = call("search_flights", {"origin": origin, "destination": dest, "day": day})["flights"]
        open_ = [f for f in flights if f["seats_left"] > 0 and f["id"] != exp["flight_id"]]
        if not open_:  # the wanted flight is the day's only open one: the sloppy agent takes the next day's
            later = call("search_flights", {"origin": origin, "destination": dest, "day": day % 14 + 1})
            open_ = [f for f in later["flights"] if f["seats_left"] > 0] or flights
        held = call("hold_seat", {"flight_id": open_[-1]["id"], "passenger_id": me["id"]})
        call("hold_seat", {"flight_id": exp["flight_id"], "passenger_id": me["id"]})
        if "held" in held:
            call("confirm_booking", {"booking_id": held["held"]})
        return "Booked!"

    def claim_only(s: Scenario, call: Call) -> str:
        return f"Your trip is booked and booking {exp.get('booking_id', 'BK1151')} is confirmed."

    return [sloppy, claim_only]


SPEC = EnvSpec(
    name="flight_booking",
    description="Search, hold, book and change flights within fare rules.",
    system_prompt=SYSTEM,
    build_seed=build_seed,
    make_scenarios=make_scenarios,
    tools=TOOLS,
    grade=grade,
    gold=gold,
    bad=bad,
    limits=Limits(max_turns=10),
)
