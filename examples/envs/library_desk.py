"""A library desk: lend books to members and take them back, within the lending rules.

The environment docs/environments.md builds in "Write your own environment". From this folder:

    grooves env validate library_desk:SPEC      # the gold solver scores 1.0, the bad ones low
    grooves eval smollm2-135m --task library_desk:SPEC --scenarios 10

Lending one more book than a member's limit is allowed by the tool (as a real back office would
let a clerk do it); keeping to the rule is the agent's job, and the grader checks it on the final
database against the seed: the right loan and nothing else, then an answer that says so.
"""

from __future__ import annotations

import random
import re

from grooves.envs import (
    EnvSpec,
    Grade,
    GradeInput,
    Limits,
    Tool,
    ToolError,
    assign_splits,
    changed_keys,
    integer,
    like_pattern,
    obj,
    string,
)

TODAY = 100  # the desk's day number; a loan is due 14 days later
TITLES = (
    "The Salt Road; Winter Orchard; A Map of Rivers; Nine Lanterns; The Glass Tide; Copper Hills; "
    "The Quiet Engine; Paper Comets; Under Linden; The Last Ferry; Small Hours; Harbour Lights"
).split("; ")
NAMES = ["ana", "ben", "chen", "dara", "eli", "fatou", "goran", "hana", "ivo", "jun", "kemi", "lior"]
SYSTEM = (
    f"You run a library's lending desk (today is day {TODAY}). Look the member and the book up before "
    "acting. Rules: lend only if a copy is available and the member has fewer open loans than their "
    "max_loans; otherwise do not lend, and say why (their limit, or no copy available). When you lend, "
    "give the due day; when you take a book back, name it."
)


def build_seed(conn, seed: int) -> None:
    """The database every episode starts from: books, members, and some open loans."""
    rng = random.Random(seed)
    conn.executescript("""
        CREATE TABLE books (book_id TEXT PRIMARY KEY, title TEXT NOT NULL, available INTEGER NOT NULL);
        CREATE TABLE members (member_id TEXT PRIMARY KEY, email TEXT UNIQUE NOT NULL, max_loans INTEGER NOT NULL);
        CREATE TABLE loans (loan_id INTEGER PRIMARY KEY, book_id TEXT NOT NULL REFERENCES books,
            member_id TEXT NOT NULL REFERENCES members, due_day INTEGER NOT NULL, returned INTEGER DEFAULT 0);
    """)
    for i, title in enumerate(TITLES):
        conn.execute("INSERT INTO books VALUES (?, ?, ?)", (f"B{i + 10}", title, rng.choice([1, 1, 2])))
    for i, name in enumerate(NAMES):
        member = (f"M{i + 10}", f"{name}@example.org", rng.choice([1, 2, 3]))
        conn.execute("INSERT INTO members VALUES (?, ?, ?)", member)
        for book in rng.sample(TITLES, rng.randint(0, 2)):  # some open loans, never one book twice
            _lend(conn, f"B{TITLES.index(book) + 10}", member[0], TODAY + rng.randint(1, 13))


def _lend(conn, book_id: str, member_id: str, due_day: int) -> int | None:
    """The new loan's id, or None when no copy is left."""
    if not conn.execute(
        "UPDATE books SET available = available - 1 WHERE book_id = ? AND available > 0", (book_id,)
    ).rowcount:
        return None
    sql = "INSERT INTO loans (book_id, member_id, due_day) VALUES (?, ?, ?)"
    return conn.execute(sql, (book_id, member_id, due_day)).lastrowid


def make_scenarios(conn, seed: int) -> list[dict]:
    """80 requests, every 4th one validation (60 train, 20 validation); `expected` is for the grader."""
    rng, out, seen = random.Random(seed), [], set()
    members = conn.execute(
        "SELECT *, (SELECT count(*) FROM loans l WHERE l.member_id = m.member_id) AS open FROM members m"
    ).fetchall()
    books = conn.execute("SELECT * FROM books").fetchall()
    loans = conn.execute(
        "SELECT loan_id, email, title FROM loans JOIN members USING (member_id) "
        "JOIN books USING (book_id) WHERE NOT returned"
    ).fetchall()
    while len(out) < 80:
        if rng.random() < 0.3:
            loan = rng.choice(loans)
            prompt = f"Hi, this is {loan['email']}. I am bringing back '{loan['title']}'."
            expected = {"kind": "return", "loan_id": loan["loan_id"], "title": loan["title"]}
        else:
            member, book = rng.choice(members), rng.choice(books)
            reason = (
                "limit"
                if member["open"] >= member["max_loans"]
                else "available"
                if not book["available"]
                else None
            )
            prompt = f"Please lend '{book['title']}' to {member['email']}."
            expected = {"kind": "decline" if reason else "lend", "reason": reason, "title": book["title"]}
            expected |= {
                "book_id": book["book_id"],
                "member_id": member["member_id"],
                "email": member["email"],
            }
        if prompt not in seen:
            seen.add(prompt)
            out.append({"prompt": prompt, "expected": expected})
    return assign_splits("library_desk", out, validation_every=4)


def find_member(ctx, args):
    member = ctx.state.one("SELECT member_id, max_loans FROM members WHERE email = ?", (args["email"],))
    if member is None:
        raise ToolError(f"no member with the email {args['email']}")
    member["open_loans"] = ctx.state.query(
        "SELECT loan_id, title, due_day FROM loans JOIN books USING (book_id) WHERE member_id = ? AND NOT returned",
        (member["member_id"],),
    )
    return member


def search_books(ctx, args):
    sql = "SELECT * FROM books WHERE title LIKE ? ESCAPE '\\' LIMIT 5"  # the query is data, never SQL
    return ctx.state.query(sql, (like_pattern(args["query"]),))


def lend_book(ctx, args):
    """Lends whatever it is asked to while a copy is left: the loan limit is the agent's to keep."""
    if ctx.state.one("SELECT 1 FROM members WHERE member_id = ?", (args["member_id"],)) is None:
        raise ToolError(f"no member {args['member_id']}")
    with ctx.state.conn:  # one transaction: the copy and the loan together
        loan_id = _lend(ctx.state.conn, args["book_id"], args["member_id"], TODAY + 14)
    if loan_id is None:
        raise ToolError(f"no copy of {args['book_id']} is available (or no such book)")
    return {"loan_id": loan_id, "due_day": TODAY + 14}


def return_book(ctx, args):
    loan = ctx.state.one("SELECT book_id FROM loans WHERE loan_id = ? AND NOT returned", (args["loan_id"],))
    if loan is None:
        raise ToolError(f"no open loan {args['loan_id']}")
    with ctx.state.conn:
        ctx.state.conn.execute("UPDATE loans SET returned = 1 WHERE loan_id = ?", (args["loan_id"],))
        ctx.state.conn.execute(
            "UPDATE books SET available = available + 1 WHERE book_id = ?", (loan["book_id"],)
        )
    return {"returned": args["loan_id"]}


TOOLS = [
    Tool(
        "find_member",
        "A member by email: id, max_loans, open loans.",
        obj({"email": string("email")}, ["email"]),
        find_member,
    ),
    Tool(
        "search_books",
        "Books whose title contains the query, with copies available.",
        obj({"query": string("words of the title")}, ["query"]),
        search_books,
    ),
    Tool(
        "lend_book",
        "Lend a book to a member.",
        obj({"member_id": string("M.."), "book_id": string("B..")}, ["member_id", "book_id"]),
        lend_book,
    ),
    Tool(
        "return_book",
        "Take a loaned book back.",
        obj({"loan_id": integer("loan id")}, ["loan_id"]),
        return_book,
    ),
]


def grade(g: GradeInput) -> Grade:
    """0.8 for the right loans in the final database (and no other change), 0.2 for saying so."""
    exp, answer = g.scenario["expected"], g.answer.lower()
    changed = changed_keys(g.seed.connection, g.state.conn, "loans", "loan_id")  # loans added or altered
    if exp["kind"] == "lend":
        new = [g.state.one("SELECT book_id, member_id FROM loans WHERE loan_id = ?", (k,)) for k in changed]
        acted, told = (
            new == [{"book_id": exp["book_id"], "member_id": exp["member_id"]}],
            str(TODAY + 14) in answer,
        )
    elif exp["kind"] == "return":
        acted, told = changed == {exp["loan_id"]}, exp["title"].lower() in answer
    else:  # decline: nothing lent, after looking the member up
        acted = not changed and ("find_member", {"email": exp["email"]}) in g.calls
        told = exp["reason"] in answer
    parts = {"action": float(acted), "answer": float(acted and told)}  # words alone earn nothing
    notes = [] if acted else [f"not what a {exp['kind']} leaves: loans changed {sorted(changed)}"]
    return Grade(score=0.8 * parts["action"] + 0.2 * parts["answer"], parts=parts, notes=notes)


def gold(scenario, call) -> str:
    """What a careful clerk does, from the request and the tools' answers alone."""
    email = re.search(r"\S+@example\.org", scenario["prompt"])[0]
    title = re.search(r"'(.+)'", scenario["prompt"])[1]
    member = call("find_member", {"email": email})
    if scenario["expected"]["kind"] == "return":
        loan = next(loan for loan in member["open_loans"] if loan["title"] == title)
        call("return_book", {"loan_id": loan["loan_id"]})
        return call.say(f"Thank you, '{title}' is returned.", f"Got it: '{title}' is back on the shelf.")
    if len(member["open_loans"]) >= member["max_loans"]:
        return call.say(f"Sorry, you have reached your limit of {member['max_loans']} loans.")
    book = next(b for b in call("search_books", {"query": title}) if b["title"] == title)
    if book["available"] < 1:
        return call.say(f"Sorry, no copy of '{title}' is available right now.")
    loan = call("lend_book", {"member_id": member["member_id"], "book_id": book["book_id"]})
    return call.say(
        f"Done: '{title}' is due back on day {loan['due_day']}.",
        f"Lent; please return it by day {loan['due_day']}.",
    )


def claim_without_acting(scenario, call) -> str:
    return f"Done: '{scenario['expected']['title']}' is due back on day {TODAY + 14}; it is returned."


def lend_over_the_limit(scenario, call) -> str:
    exp = scenario["expected"]
    call("lend_book", {"member_id": exp["member_id"], "book_id": exp["book_id"]})
    return f"Done: due back on day {TODAY + 14}."


def bad(scenario) -> list:
    """Known-bad solvers for this scenario: each must score at most 0.5 on it."""
    over = scenario["expected"].get("reason") == "limit"
    return [claim_without_acting, *([lend_over_the_limit] if over else [])]


SPEC = EnvSpec(
    name="library_desk",
    description="lend and take back books within the lending rules",
    system_prompt=SYSTEM,
    build_seed=build_seed,
    make_scenarios=make_scenarios,
    tools=TOOLS,
    grade=grade,
    gold=gold,
    bad=bad,
    limits=Limits(max_turns=6),
)
