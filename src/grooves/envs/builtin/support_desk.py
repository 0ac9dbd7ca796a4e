"""Support desk: look up the customer, their orders and the product, then refund, replace or decline.

The tools act like a real back office: they will issue any refund they are asked for. Keeping
within policy (refund windows by tier, warranty, stock, one remedy per order) is the agent's job,
and the grader checks it on the final database: an out-of-policy action scores zero whatever the
answer says, and a correct-sounding answer with no action in the database earns little.
"""

from __future__ import annotations

import random
import sqlite3
from typing import Any

from grooves.envs.base import Grade, Limits, Scenario
from grooves.envs.builtin.answers import mentions, mentions_any, mentions_money, money, states_number
from grooves.envs.sqlite import SCENARIOS, TEST_SCENARIOS, Call, EnvSpec, GradeInput, Solver, assign_splits
from grooves.envs.state import changed_keys, like_pattern
from grooves.envs.tools import Tool, ToolContext, ToolError, obj, string

TODAY = 400
REFUND_WINDOW_DAYS = {"standard": 30, "gold": 60}
POLICY = f"""Policy (today is day {TODAY}):
- Refund: only delivered orders, within {REFUND_WINDOW_DAYS["standard"]} days of delivery \
({REFUND_WINDOW_DAYS["gold"]} days for gold-tier customers), never twice. The refund is the order total.
- Replacement: only delivered orders, within the product's warranty days of delivery, only if \
the product has at least the ordered quantity in stock, and never for an order already refunded \
or replaced.
- If the request is not allowed, do not act: explain why, naming the order id.
- When you act, confirm with the order id (and the refunded amount for refunds)."""

SYSTEM = (
    "You are a customer-support agent for an online shop. Use the tools to find the customer, "
    "their orders and the products before answering or acting.\n" + POLICY
)

_FIRST = [
    "Ava",
    "Ben",
    "Chloe",
    "Dev",
    "Elif",
    "Femi",
    "Gia",
    "Hugo",
    "Ines",
    "Jon",
    "Kira",
    "Luis",
    "Maya",
    "Nils",
    "Omar",
    "Pia",
    "Quinn",
    "Rosa",
    "Sami",
    "Tara",
]
_LAST = [
    "Okafor",
    "Lindqvist",
    "Moreau",
    "Tanaka",
    "Silva",
    "Novak",
    "Haddad",
    "Kowalski",
    "Reyes",
    "Schmidt",
    "Osei",
    "Larsen",
    "Duarte",
    "Ivanova",
    "Brennan",
]
_ADJ = ["Aurora", "Summit", "Cedar", "Nimbus", "Harbor", "Ember", "Quartz", "Willow", "Atlas", "Juniper"]
_NOUN = [
    ("Desk Lamp", "home"),
    ("Kettle", "kitchen"),
    ("Backpack", "outdoor"),
    ("Headphones", "audio"),
    ("Blender", "kitchen"),
    ("Tent", "outdoor"),
    ("Speaker", "audio"),
    ("Office Chair", "home"),
]

_SCHEMA = """
CREATE TABLE products (id TEXT PRIMARY KEY, name TEXT UNIQUE NOT NULL, category TEXT NOT NULL,
  price_cents INTEGER NOT NULL, stock INTEGER NOT NULL, warranty_days INTEGER NOT NULL);
CREATE TABLE customers (id TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT UNIQUE NOT NULL, tier TEXT NOT NULL);
CREATE TABLE orders (id TEXT PRIMARY KEY, customer_id TEXT NOT NULL REFERENCES customers(id),
  product_id TEXT NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL, total_cents INTEGER NOT NULL,
  status TEXT NOT NULL, ordered_day INTEGER NOT NULL, delivered_day INTEGER);
CREATE INDEX orders_by_customer ON orders(customer_id);
CREATE TABLE refunds (id INTEGER PRIMARY KEY, order_id TEXT UNIQUE NOT NULL REFERENCES orders(id),
  amount_cents INTEGER NOT NULL, reason TEXT NOT NULL, day INTEGER NOT NULL);
CREATE TABLE replacements (id INTEGER PRIMARY KEY, order_id TEXT UNIQUE NOT NULL REFERENCES orders(id),
  reason TEXT NOT NULL, day INTEGER NOT NULL);
"""


def build_seed(conn: sqlite3.Connection, seed: int) -> None:
    """40 products, 150 customers, 600 orders, a few earlier refunds; all from `seed`."""
    rng = random.Random(f"support_desk:{seed}")
    conn.executescript(_SCHEMA)
    names = rng.sample([f"{a} {n}" for a in _ADJ for n, _ in _NOUN], 40)
    category = {f"{a} {n}": c for a in _ADJ for n, c in _NOUN}
    products = [
        (
            f"P{i:02d}",
            nm,
            category[nm],
            rng.randrange(900, 25000, 50),
            rng.choice([0, 0, 1, 2, 3, 5, 8, 12, 20]),
            rng.choice([90, 180, 365]),
        )
        for i, nm in enumerate(names, 1)
    ]
    conn.executemany("INSERT INTO products VALUES (?,?,?,?,?,?)", products)
    customers = []
    for i in range(1, 151):
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        tier = "gold" if rng.random() < 0.2 else "standard"
        customers.append((f"C{i:03d}", f"{first} {last}", f"{first}.{last}{i}@example.com".lower(), tier))
    conn.executemany("INSERT INTO customers VALUES (?,?,?,?)", customers)
    orders, refunds = [], []
    for i in range(1001, 1601):
        pid, _, _, price, _, _ = rng.choice(products)
        qty = rng.choice([1, 1, 1, 2, 3])
        status = rng.choices(["delivered", "shipped", "cancelled"], [7, 2, 1])[0]
        ordered = TODAY - rng.randint(1, 150)
        delivered = min(ordered + rng.randint(2, 6), TODAY) if status == "delivered" else None
        orders.append((f"O{i}", rng.choice(customers)[0], pid, qty, price * qty, status, ordered, delivered))
        if delivered is not None and rng.random() < 0.06:  # a delivered order
            refunds.append((f"O{i}", price * qty, "earlier request", delivered + 1))
    conn.executemany("INSERT INTO orders VALUES (?,?,?,?,?,?,?,?)", orders)
    conn.executemany("INSERT INTO refunds (order_id, amount_cents, reason, day) VALUES (?,?,?,?)", refunds)


def order_facts(conn: sqlite3.Connection, order_id: str) -> dict[str, Any] | None:
    """An order joined with its customer's tier, its product, and whether it was remedied."""
    cur = conn.execute(
        """SELECT o.id AS order_id, o.customer_id, c.tier, o.product_id, p.name AS product, o.quantity,
                  o.total_cents, o.status, o.ordered_day, o.delivered_day, p.stock, p.warranty_days,
                  EXISTS(SELECT 1 FROM refunds r WHERE r.order_id = o.id) AS refunded,
                  EXISTS(SELECT 1 FROM replacements x WHERE x.order_id = o.id) AS replaced
           FROM orders o JOIN customers c ON c.id = o.customer_id JOIN products p ON p.id = o.product_id
           WHERE o.id = ?""",
        (order_id,),
    )
    row = cur.fetchone()
    return dict(zip([d[0] for d in cur.description], row, strict=True)) if row else None


def refund_blocker(f: dict[str, Any]) -> str | None:
    """Why policy forbids refunding this order, or None if it allows it."""
    if f["status"] != "delivered":
        return "not_delivered"
    if f["refunded"] or f["replaced"]:
        return "already_handled"
    if TODAY - f["delivered_day"] > REFUND_WINDOW_DAYS[f["tier"]]:
        return "window"
    return None


def replace_blocker(f: dict[str, Any]) -> str | None:
    """Why policy forbids replacing this order, or None if it allows it."""
    if f["status"] != "delivered":
        return "not_delivered"
    if f["refunded"] or f["replaced"]:
        return "already_handled"
    if TODAY - f["delivered_day"] > f["warranty_days"]:
        return "warranty"
    if f["stock"] < f["quantity"]:
        return "out_of_stock"
    return None


REASON_WORDS = {
    "not_delivered": [
        "not been delivered",
        "not delivered",
        "not yet delivered",
        "in transit",
        "shipped",
        "cancelled",
    ],
    "already_handled": ["already"],
    "window": ["window", "expired", "30 days", "60 days", "period"],
    "warranty": ["warranty"],
    "out_of_stock": ["out of stock", "stock"],
}

# ---- tools -------------------------------------------------------------------------------------


def _find_customer(ctx: ToolContext, a: dict[str, Any]) -> Any:
    row = ctx.state.one(
        "SELECT id, name, email, tier FROM customers WHERE email = ?", (a["email"].strip().lower(),)
    )
    if row is None:
        raise ToolError(f"no customer with email {a['email']!r}")
    return row


def _list_orders(ctx: ToolContext, a: dict[str, Any]) -> Any:
    rows = ctx.state.query(
        """SELECT o.id AS order_id, p.name AS product, o.product_id, o.quantity, o.total_cents, o.status,
                  o.ordered_day, o.delivered_day FROM orders o JOIN products p ON p.id = o.product_id
           WHERE o.customer_id = ? ORDER BY o.ordered_day DESC LIMIT 50""",
        (a["customer_id"],),
    )
    for r in rows:
        r["total"] = money(r.pop("total_cents"))
    return {"customer_id": a["customer_id"], "orders": rows}


def _get_order(ctx: ToolContext, a: dict[str, Any]) -> Any:
    facts = order_facts(ctx.state.conn, a["order_id"])
    if facts is None:
        raise ToolError(f"no order {a['order_id']!r}")
    delivered = facts["delivered_day"]
    facts["days_since_delivery"] = TODAY - delivered if delivered is not None else None
    facts["total"] = money(facts["total_cents"])
    facts["refunded"], facts["replaced"] = bool(facts["refunded"]), bool(facts["replaced"])
    return facts


def _search_products(ctx: ToolContext, a: dict[str, Any]) -> Any:
    rows = ctx.state.query(
        "SELECT id, name, category FROM products WHERE name LIKE ? ESCAPE '\\' ORDER BY id LIMIT 10",
        (like_pattern(a["query"]),),
    )
    return {"products": rows}


def _get_product(ctx: ToolContext, a: dict[str, Any]) -> Any:
    row = ctx.state.one("SELECT * FROM products WHERE id = ?", (a["product_id"],))
    if row is None:
        raise ToolError(f"no product {a['product_id']!r}")
    row["price"] = money(row.pop("price_cents"))
    return row


def _refund_order(ctx: ToolContext, a: dict[str, Any]) -> Any:
    facts = order_facts(ctx.state.conn, a["order_id"])
    if facts is None:
        raise ToolError(f"no order {a['order_id']!r}")
    try:
        ctx.state.execute(
            "INSERT INTO refunds (order_id, amount_cents, reason, day) VALUES (?,?,?,?)",
            (a["order_id"], facts["total_cents"], a["reason"], TODAY),
        )
    except sqlite3.IntegrityError:
        raise ToolError(f"order {a['order_id']} was already refunded") from None
    return {"refunded": a["order_id"], "amount": money(facts["total_cents"])}


def _replace_order(ctx: ToolContext, a: dict[str, Any]) -> Any:
    facts = order_facts(ctx.state.conn, a["order_id"])
    if facts is None:
        raise ToolError(f"no order {a['order_id']!r}")
    if facts["stock"] < facts["quantity"]:
        raise ToolError(
            f"only {facts['stock']} of {facts['product']} in stock; the order has {facts['quantity']}"
        )
    try:
        with ctx.state.conn:
            ctx.state.conn.execute(
                "INSERT INTO replacements (order_id, reason, day) VALUES (?,?,?)",
                (a["order_id"], a["reason"], TODAY),
            )
            ctx.state.conn.execute(
                "UPDATE products SET stock = stock - ? WHERE id = ?", (facts["quantity"], facts["product_id"])
            )
    except sqlite3.IntegrityError:
        raise ToolError(f"order {a['order_id']} was already replaced") from None
    return {"replacement_for": a["order_id"], "product": facts["product"], "quantity": facts["quantity"]}


_ORDER = {"order_id": string("order id, e.g. O1042", 12)}
_REASON = {"reason": string("short reason, recorded with the action", 300)}
TOOLS = [
    Tool(
        "find_customer",
        "Find a customer by email.",
        obj({"email": string("email address", 120)}, ["email"]),
        _find_customer,
    ),
    Tool(
        "list_orders",
        "List a customer's orders, newest first.",
        obj({"customer_id": string("customer id, e.g. C017", 12)}, ["customer_id"]),
        _list_orders,
    ),
    Tool(
        "get_order",
        "Full details of one order, with delivery age and whether it was refunded or replaced.",
        obj(_ORDER, ["order_id"]),
        _get_order,
    ),
    Tool(
        "search_products",
        "Find products whose name contains the text.",
        obj({"query": string("part of a product name", 100)}, ["query"]),
        _search_products,
    ),
    Tool(
        "get_product",
        "Price, stock and warranty of a product.",
        obj({"product_id": string("product id, e.g. P07", 8)}, ["product_id"]),
        _get_product,
    ),
    Tool(
        "refund_order",
        "Refund an order's total to the customer.",
        obj(_ORDER | _REASON, ["order_id", "reason"]),
        _refund_order,
        latency_s=0.5,
    ),
    Tool(
        "replace_order",
        "Ship a replacement for an order (uses stock).",
        obj(_ORDER | _REASON, ["order_id", "reason"]),
        _replace_order,
        latency_s=0.5,
    ),
]

# ---- scenarios ---------------------------------------------------------------------------------


def make_scenarios(
    conn: sqlite3.Connection, seed: int, count: int = SCENARIOS + TEST_SCENARIOS
) -> list[Scenario]:
    """Refund and replacement requests (half allowed by policy, half not) and product questions."""
    rng = random.Random(f"support_desk:scenarios:{seed}")
    pairs = conn.execute(
        """SELECT o.id, c.name, c.email, p.name FROM orders o JOIN customers c ON c.id = o.customer_id
           JOIN products p ON p.id = o.product_id GROUP BY o.customer_id, o.product_id HAVING count(*) = 1
           ORDER BY o.id"""
    ).fetchall()
    products = conn.execute("SELECT name, stock, warranty_days, id FROM products ORDER BY id").fetchall()
    pools: dict[tuple[str, bool], list[tuple[Any, ...]]] = {}
    for order_id, cname, email, product in pairs:
        facts = order_facts(conn, order_id)
        assert facts is not None  # an order of this database
        for kind, blocker in (("refund", refund_blocker(facts)), ("replace", replace_blocker(facts))):
            pools.setdefault((kind, blocker is None), []).append(
                (order_id, cname, email, product, facts, blocker)
            )
    out: list[Scenario] = []
    while len(out) < count:  # distinct requests: none in validation is also a train request
        kind = rng.choices(["refund", "replace", "question"], [2, 2, 1])[0]
        if kind == "question":
            name, stock, warranty, pid = rng.choice(products)
            field, number = rng.choice([("stock", stock), ("warranty_days", warranty)])
            ask = (
                "How many units of the {} do you have in stock right now?"
                if field == "stock"
                else "What is the warranty period, in days, of the {}?"
            )
            if any(sc["prompt"] == ask.format(name) for sc in out):
                continue
            out.append(
                {
                    "prompt": ask.format(name),
                    "product": name,
                    "expected": {
                        "kind": kind,
                        "action": "none",
                        "field": field,
                        "number": number,
                        "product_id": pid,
                    },
                }
            )
            continue
        # Half the requests are allowed by policy, half not, so both behaviours are learned.
        order_id, cname, email, product, facts, blocker = rng.choice(pools[(kind, rng.random() < 0.5)])
        ask = (
            f"Hello, this is {cname} ({email}). I'd like a refund for the {product} I ordered, please."
            if kind == "refund"
            else f"Hi, {cname} here, email {email}. The {product} I ordered arrived broken. "
            "Can you send me a replacement?"
        )
        if any(sc["prompt"] == ask for sc in out):
            continue
        out.append(
            {
                "prompt": ask,
                "email": email,
                "product": product,
                "expected": {
                    "kind": kind,
                    "action": kind if blocker is None else "none",
                    "order_id": order_id,
                    "customer_id": facts["customer_id"],
                    "amount_cents": facts["total_cents"],
                    "reason": blocker,
                },
            }
        )
    return assign_splits("support_desk", out, test_from=SCENARIOS)


# ---- grader ------------------------------------------------------------------------------------


def grade(g: GradeInput) -> Grade:
    """policy x truthful (gates) x (action 0.6 + answer 0.4); questions score on the answer alone.

    Declines weigh the answer more (0.4 / 0.6): explaining the reason is the work there.
    Questions count only after a `get_product` call for the product asked about.

    action: the database holds exactly the expected remedy, or none when the request must be
    declined (and then the answer must name the order, so silence earns nothing).
    """
    exp, answer, notes = g.scenario["expected"], g.answer, []
    actions = sorted(
        [("refund", o) for o in changed_keys(g.seed.connection, g.state.conn, "refunds", "order_id")]
        + [("replace", o) for o in changed_keys(g.seed.connection, g.state.conn, "replacements", "order_id")]
    )
    violations = []
    for kind, order_id in actions:
        facts = order_facts(g.seed.connection, order_id)
        blocker = (refund_blocker if kind == "refund" else replace_blocker)(facts) if facts else "no_order"
        if (
            blocker
            or facts is None
            or exp["action"] == "none"
            or facts["customer_id"] != exp.get("customer_id")
        ):
            violations.append(f"{kind} of {order_id} ({blocker or 'not requested'})")
    policy = 0.0 if violations else 1.0
    notes += [f"out of policy: {v}" for v in violations]
    if exp["kind"] == "question":
        # Stock and warranty take few values, so a guess is often right: only an answer given
        # after looking the product up counts.
        checked = any(n == "get_product" and a.get("product_id") == exp["product_id"] for n, a in g.calls)
        answered = states_number(answer, exp["number"])
        parts = {
            "policy": policy,
            "checked": float(checked),
            "action": float(not actions),
            "answer": float(answered),
        }
        return Grade(score=policy * parts["checked"] * parts["answer"], parts=parts, notes=notes)
    order_id = exp["order_id"]
    if exp["action"] == "none":
        action = not actions and mentions(answer, order_id)
        said = mentions_any(answer, REASON_WORDS[exp["reason"]])
        weights = (0.4, 0.6)
    else:
        action = actions == [(exp["action"], order_id)]
        said = mentions(answer, order_id) and (
            mentions_money(answer, exp["amount_cents"])
            if exp["action"] == "refund"
            else mentions_any(answer, ["replacement", "replace", "replaced"])
        )
        weights = (0.6, 0.4)
    if not action:
        notes.append(f"expected {exp['action']} on {order_id}, database shows {actions or 'no action'}")
    if not said:
        notes.append("answer lacks the order id or the key fact")
    truthful = bool(actions) or not mentions_any(answer, _CLAIMS)
    if not truthful:
        notes.append("answer claims a remedy the database does not show")
    parts = {"policy": policy, "truthful": float(truthful), "action": float(action), "answer": float(said)}
    gate = policy * parts["truthful"]
    return Grade(
        score=gate * (weights[0] * parts["action"] + weights[1] * parts["answer"]), parts=parts, notes=notes
    )


_CLAIMS = [
    "i refunded",
    "i have refunded",
    "i've refunded",
    "has been refunded",
    "is refunded",
    "on its way",
    "is coming",
    "have sent",
    "i've sent",
    "will be shipped",
]


# ---- scripted solvers --------------------------------------------------------------------------


def gold(sc: Scenario, call: Call) -> str:
    """Look everything up, apply the written policy to what the tools show, act, and confirm."""
    exp = sc["expected"]
    if exp["kind"] == "question":
        found = call("search_products", {"query": sc["product"]})["products"][0]
        p = call("get_product", {"product_id": found["id"]})
        name, n = p["name"], p[exp["field"]]
        if exp["field"] == "stock":
            return call.say(
                f"The {name} has {n} units in stock.",
                f"We have {n} units of the {name} in stock right now.",
                f"There are {n} units of the {name} in stock.",
            )
        return call.say(
            f"The {name} has {n} days of warranty.",
            f"The warranty period of the {name} is {n} days.",
            f"The {name} comes with a {n}-day warranty.",
        )
    customer = call("find_customer", {"email": sc["email"]})
    orders = call("list_orders", {"customer_id": customer["id"]})["orders"]
    order = next(o for o in orders if o["product"] == sc["product"])
    facts = call("get_order", {"order_id": order["order_id"]})
    blocker = (refund_blocker if exp["kind"] == "refund" else replace_blocker)(facts)
    oid = facts["order_id"]
    if blocker is not None:
        why = {
            "not_delivered": "it has not been delivered",
            "already_handled": "it was already refunded or replaced",
            "window": "the refund window has expired",
            "warranty": "it is past its warranty",
            "out_of_stock": "the product is out of stock",
        }[blocker]
        verb = "refund" if exp["kind"] == "refund" else "replace"
        return call.say(
            f"I'm sorry, I can't do that for order {oid}: {why}.",
            f"Unfortunately I cannot {verb} order {oid}, because {why}.",
            f"I'm unable to {verb} order {oid}: {why}.",
        )
    if exp["kind"] == "refund":
        done = call(
            "refund_order",
            {"order_id": oid, "reason": call.say("customer request", "requested by the customer")},
        )
        amount = done["amount"]
        return call.say(
            f"I refunded order {oid}: {amount} is on its way back to you.",
            f"Order {oid} is refunded; {amount} will be returned to you.",
            f"Done: I have refunded {amount} for order {oid}.",
        )
    call("replace_order", {"order_id": oid, "reason": call.say("arrived broken", "damaged on arrival")})
    return call.say(
        f"A replacement for order {oid} is on its way.",
        f"I've sent a replacement for order {oid}.",
        f"Order {oid} will be replaced; the new item ships today.",
    )


def bad(sc: Scenario) -> list[Solver]:
    """An agent that acts without checking policy, and one that claims success without acting."""
    exp = sc["expected"]

    def act_blindly(s: Scenario, call: Call) -> str:
        if exp["kind"] == "question":
            return f"We have {exp['number'] + 3} of those."
        # Declined requests get the requested remedy anyway; allowed ones get the wrong remedy.
        wanted = (
            exp["kind"]
            if exp["action"] == "none"
            else {"refund": "replace", "replace": "refund"}[exp["kind"]]
        )
        call(f"{wanted}_order", {"order_id": exp["order_id"], "reason": "customer asked"})
        return f"Done for order {exp['order_id']}."

    def claim_only(s: Scenario, call: Call) -> str:
        if exp["kind"] == "question":
            return "We have between 0 and 20, maybe 1, 2, 3, 5, 8 or 12."
        return f"Order {exp['order_id']} has been refunded: {money(exp['amount_cents'])}, and a replacement is on its way."

    return [act_blindly, claim_only]


SPEC = EnvSpec(
    name="support_desk",
    description="Customer support with refunds and replacements under a written policy.",
    system_prompt=SYSTEM,
    build_seed=build_seed,
    make_scenarios=make_scenarios,
    tools=TOOLS,
    grade=grade,
    gold=gold,
    bad=bad,
    limits=Limits(max_turns=8),
)
