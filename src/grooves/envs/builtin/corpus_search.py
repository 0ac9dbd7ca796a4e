"""Corpus search: answer questions from a generated encyclopedia through imperfect retrieval.

The corpus describes invented towns, companies and birds, so no model knows the answers from
pretraining, and look-alike entries ("Varnholt" the town, "Varnholt Mills" the company) make a
careless reading wrong. Retrieval is deliberately imperfect, as production search is: ranking
is BM25 (SQLite FTS5) with multiplicative noise, snippets are cut short, and documents are read
a page at a time, each call costing simulated seconds against a latency budget.

The grader credits an answer that states the fact and penalises hedging: an answer that also
states a look-alike's value is wrong, so listing every candidate earns nothing.
"""

from __future__ import annotations

import math
import random
import re
import sqlite3
from typing import Any

from grooves.envs.base import Grade, Limits, Scenario
from grooves.envs.builtin.answers import integers, mentions, mentions_any
from grooves.envs.sqlite import SCENARIOS, TEST_SCENARIOS, Call, EnvSpec, GradeInput, Solver, assign_splits
from grooves.envs.tools import Tool, ToolContext, ToolError, integer, obj, string

PAGE_CHARS = 300
SNIPPET_CHARS = 70
RANK_NOISE_SIGMA = 0.6
"""Log-normal noise on relevance: the right document is usually, not always, on top."""

SYSTEM = (
    "Answer the question using only the document collection, which describes places, companies "
    "and animals you have never heard of. search returns document ids, titles and short, cut-off "
    "snippets; read returns one page of a document (pass next_offset to continue). Each call takes "
    "time and your time budget is limited. Reply with the answer and cite the document id, e.g. "
    "'1723 [D017]'."
)

_SYL = [
    "var",
    "nel",
    "holt",
    "kor",
    "mi",
    "ta",
    "dun",
    "bre",
    "sil",
    "ost",
    "ka",
    "ren",
    "lo",
    "vin",
    "thar",
    "ew",
    "ash",
    "mor",
    "quen",
    "bal",
    "ith",
    "rho",
    "zen",
    "pell",
]
_REGIONS = ["Eastmarch", "the Lowfold", "Carrow Vale", "the Saltings", "Highmere", "the Tarn Basin"]
_RIVERS = ["Ombre", "Kessel", "Lathe", "Vey", "Morrin", "Sable"]
_TRADES = ["Textiles", "Ironworks", "Instruments", "Shipping", "Mills", "Foods", "Optics"]
_HABITATS = ["reed beds", "pine forest", "sea cliffs", "upland moor", "river gorges", "salt marsh"]
_BIRDS = ["Warbler", "Shrike", "Plover", "Finch", "Harrier", "Pipit"]
_COLORS = ["Ashen", "Copper", "Dusky", "Amber", "Slate", "Ivory", "Rufous", "Sooty"]
_PEOPLE = [
    "Ada Marsh",
    "Tomas Vell",
    "Irene Kord",
    "Piet Anwar",
    "Salome Rusk",
    "Yusuf Brant",
    "Greta Holm",
    "Nikolai Fenn",
    "Odile Sarr",
    "Rafael Quist",
]
_FILLER = [
    "Its archives were catalogued in a later survey.",
    "Local records from the period are incomplete.",
    "Visitors often remark on the weather.",
    "A small museum keeps related photographs.",
    "The name appears in several older maps with different spellings.",
    "Accounts from travellers vary in their details.",
]

_SCHEMA = """
CREATE TABLE docs (id TEXT PRIMARY KEY, title TEXT NOT NULL, body TEXT NOT NULL);
CREATE VIRTUAL TABLE docs_fts USING fts5(doc_id UNINDEXED, title, body);
"""


def _names(rng: random.Random, count: int) -> list[str]:
    names: set[str] = set()
    while len(names) < count:
        names.add("".join(rng.sample(_SYL, rng.choice([2, 3]))).capitalize())
    return sorted(names)


def _document(rng: random.Random, facts: list[str]) -> str:
    """Facts spread among filler sentences, so the first snippet rarely shows them all."""
    sentences = facts[:1] + rng.sample(_FILLER, 3) + facts[1:]
    head, rest = sentences[:1], sentences[1:]
    rng.shuffle(rest)
    return " ".join(head + rest)


def entities(seed: int) -> dict[str, list[dict[str, Any]]]:
    """The invented world: 50 towns, 40 companies (some named after towns), 36 birds."""
    rng = random.Random(f"corpus_search:{seed}")
    names = _names(rng, 90)
    towns = [
        {
            "name": n,
            "founded": rng.randint(1200, 1900),
            "population": rng.randrange(800, 90000, 10),
            "region": rng.choice(_REGIONS),
            "river": rng.choice(_RIVERS),
        }
        for n in names[:50]
    ]
    companies = []
    for i, n in enumerate(names[50:90]):
        base = towns[i]["name"] if i < 20 else n  # half borrow a town's name: the look-alikes
        companies.append(
            {
                "name": f"{base} {rng.choice(_TRADES)}",
                "founded": rng.randint(1780, 2010),
                "founder": rng.choice(_PEOPLE),
                "hq": rng.choice(towns)["name"],
                "employees": rng.randrange(40, 20000, 10),
            }
        )
    birds = [
        {
            "name": f"{c} {b}",
            "wingspan_cm": rng.randint(14, 120),
            "habitat": rng.choice(_HABITATS),
            "described": rng.randint(1750, 1990),
        }
        for c in _COLORS
        for b in _BIRDS
    ]
    return {"towns": towns, "companies": companies, "birds": rng.sample(birds, 36)}


def build_seed(conn: sqlite3.Connection, seed: int) -> None:
    rng = random.Random(f"corpus_search:docs:{seed}")
    world = entities(seed)
    docs = []
    for t in world["towns"]:
        docs.append(
            (
                t["name"],
                [
                    f"{t['name']} is a town in {t['region']} on the river {t['river']}.",
                    f"{t['name']} was founded in {t['founded']}.",
                    f"The town has a population of {t['population']:,}.",
                ],
            )
        )
    for c in world["companies"]:
        docs.append(
            (
                c["name"],
                [
                    f"{c['name']} is a company headquartered in {c['hq']}.",
                    f"It was founded in {c['founded']} by {c['founder']}.",
                    f"{c['name']} employs {c['employees']:,} people.",
                ],
            )
        )
    for b in world["birds"]:
        docs.append(
            (
                f"{b['name']} (bird)",
                [
                    f"The {b['name']} is a bird of {b['habitat']}.",
                    f"It was first described in {b['described']}.",
                    f"Its wingspan is about {b['wingspan_cm']} cm.",
                ],
            )
        )
    rng.shuffle(docs)
    rows = [(f"D{i:03d}", title, _document(rng, facts)) for i, (title, facts) in enumerate(docs, 1)]
    conn.executescript(_SCHEMA)
    conn.executemany("INSERT INTO docs VALUES (?,?,?)", rows)
    conn.executemany("INSERT INTO docs_fts VALUES (?,?,?)", rows)


# ---- tools -------------------------------------------------------------------------------------

_STOP = {
    "the",
    "a",
    "an",
    "of",
    "in",
    "is",
    "was",
    "what",
    "which",
    "who",
    "how",
    "many",
    "by",
    "and",
    "to",
    "does",
    "did",
    "it",
    "its",
    "for",
    "on",
    "at",
    "where",
}


def fts_query(text: str) -> str:
    """Words of the model's query as quoted FTS5 terms joined by OR.

    The result is a bound parameter, and quoting each term keeps FTS5's own query syntax (NEAR,
    column filters, quotes) out of the model's reach.

    >>> fts_query('founded "Varnholt"; DROP TABLE docs; --')
    '"founded" OR "varnholt" OR "drop" OR "table" OR "docs"'
    """
    words = [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP][:12]
    return " OR ".join(f'"{w}"' for w in words)


def _search(ctx: ToolContext, a: dict[str, Any]) -> Any:
    match = fts_query(a["query"])
    if not match:
        raise ToolError("the query has no searchable words")
    rows = ctx.state.query(
        "SELECT doc_id, title, body, -bm25(docs_fts) AS score FROM docs_fts "
        "WHERE docs_fts MATCH ? ORDER BY score DESC LIMIT 30",
        (match,),
    )
    rng = ctx.rng(a["query"])
    for r in rows:
        r["score"] *= math.exp(rng.gauss(0.0, RANK_NOISE_SIGMA))
    rows.sort(key=lambda r: -r["score"])
    terms = set(match.replace('"', "").split(" OR "))
    results = [
        {"doc_id": r["doc_id"], "title": r["title"], "snippet": _snippet(r["body"], terms)}
        for r in rows[: a.get("k", 5)]
    ]
    return {"results": results}


def _snippet(body: str, terms: set[str]) -> str:
    sentences = re.split(r"(?<=\.) ", body)
    best = max(sentences, key=lambda s: len(terms & set(re.findall(r"[a-z0-9]+", s.lower()))))
    return best if len(best) <= SNIPPET_CHARS else best[:SNIPPET_CHARS] + "..."


def _read(ctx: ToolContext, a: dict[str, Any]) -> Any:
    doc = ctx.state.one("SELECT id, title, body FROM docs WHERE id = ?", (a["doc_id"].strip().upper(),))
    if doc is None:
        raise ToolError(f"no document {a['doc_id']!r}")
    start = a.get("offset", 0)
    page = doc["body"][start : start + PAGE_CHARS]
    end = start + len(page)
    return {
        "doc_id": doc["id"],
        "title": doc["title"],
        "text": page,
        "next_offset": end if end < len(doc["body"]) else None,
    }


TOOLS = [
    Tool(
        "search",
        "Search the documents; returns ids, titles and short snippets, best first (roughly).",
        obj({"query": string("search words", 200), "k": integer("how many results", 1, 8)}, ["query"]),
        _search,
        latency_s=1.5,
    ),
    Tool(
        "read",
        f"Read {PAGE_CHARS} characters of a document from an offset.",
        obj(
            {"doc_id": string("document id, e.g. D017", 6), "offset": integer("character offset", 0, 100000)},
            ["doc_id"],
        ),
        _read,
        latency_s=1.0,
    ),
]

# ---- scenarios ---------------------------------------------------------------------------------


def make_scenarios(
    conn: sqlite3.Connection, seed: int, count: int = SCENARIOS + TEST_SCENARIOS
) -> list[Scenario]:
    """Single-fact questions on every entity type, and two-hop questions through a company's town."""
    rng = random.Random(f"corpus_search:scenarios:{seed}")
    world = entities(seed)
    doc_of = dict(conn.execute("SELECT title, id FROM docs").fetchall())
    towns = {t["name"]: t for t in world["towns"]}
    out: list[Scenario] = []
    while len(out) < count:  # distinct requests: none in validation is also a train request
        kind = rng.choice(
            [
                "town_founded",
                "town_population",
                "company_founder",
                "company_hq",
                "bird_wingspan",
                "hq_population",
            ]
        )
        if kind.startswith("town"):
            t = rng.choice(world["towns"])
            field = kind.split("_")[1]
            q = (
                f"In what year was the town of {t['name']} founded?"
                if field == "founded"
                else f"What is the population of the town of {t['name']}?"
            )
            # Look-alikes: companies named after this town, whose founding years and staff differ.
            alike = [c for c in world["companies"] if c["name"].startswith(t["name"] + " ")]
            wrong = [c["founded"] if field == "founded" else c["employees"] for c in alike]
            exp = {"answer": t[field], "doc_id": doc_of[t["name"]], "wrong": wrong}
        elif kind.startswith("company"):
            c = rng.choice(world["companies"])
            if kind == "company_founder":
                q, answer = f"Who founded {c['name']}?", c["founder"]
                wrong = [p for p in _PEOPLE if p != answer]
            else:
                q, answer = f"In which town is {c['name']} headquartered?", c["hq"]
                wrong = [n for n in towns if n != answer]
            exp = {"answer": answer, "doc_id": doc_of[c["name"]], "wrong": wrong}
        elif kind == "bird_wingspan":
            b = rng.choice(world["birds"])
            q = f"What is the wingspan of the {b['name']}, in centimetres?"
            exp = {
                "answer": b["wingspan_cm"],
                "doc_id": doc_of[f"{b['name']} (bird)"],
                "wrong": [b["described"]],
            }
        else:
            c = rng.choice(world["companies"])
            t = towns[c["hq"]]
            q = f"What is the population of the town where {c['name']} is headquartered?"
            exp = {
                "answer": t["population"],
                "doc_id": doc_of[t["name"]],
                "wrong": [c["employees"]],
                "via": doc_of[c["name"]],
            }
        if any(sc["prompt"] == q for sc in out):
            continue
        out.append({"prompt": q, "expected": {"kind": kind, **exp}})
    return assign_splits("corpus_search", out, test_from=SCENARIOS)


# ---- grader ------------------------------------------------------------------------------------


def grade(g: GradeInput) -> Grade:
    """correct x (0.8 + 0.2 x cites the document that states the fact).

    correct: the answer states the expected value and no other candidate: a numeric answer must
    contain exactly one number, and a name answer must not name another person or town, so a
    list of guesses fails.
    """
    exp, answer = g.scenario["expected"], g.answer
    value = exp["answer"]
    if isinstance(value, int):
        correct = integers(answer) == {value}
    else:
        correct = mentions(answer, value) and not mentions_any(answer, exp["wrong"])
    cited = mentions(answer, exp["doc_id"])
    spent = g.state.conn.execute("SELECT value FROM _episode WHERE key = 'budget_exhausted'").fetchone()
    parts = {
        "correct": float(correct),
        "cited": float(cited),
        "within_budget": float(not (spent and spent[0])),
    }
    notes = [] if correct else [f"expected {value!r}"]
    return Grade(score=parts["correct"] * (0.8 + 0.2 * parts["cited"]), parts=parts, notes=notes)


# ---- scripted solvers --------------------------------------------------------------------------


def _find(call: Call, query: str, title: str) -> str:
    """Search and take the result with exactly this title: ranking is noisy, so it is not always
    the first; a second search (its own noise) shows more results."""
    for request in ({"query": query}, {"query": query, "k": 8}):
        for r in call("search", request)["results"]:
            if r["title"] == title:
                return r["doc_id"]
    raise LookupError(f"search for {query!r} does not show the document titled {title!r}")


def _read_until(call: Call, doc_id: str, *wanted: str) -> str:
    """Read a document page by page until one of `wanted` has been shown (or the document ends)."""
    text, offset = "", 0
    while offset is not None and not any(w in text for w in wanted):
        page = call("read", {"doc_id": doc_id, "offset": offset})
        text, offset = text + page["text"], page["next_offset"]
    return text


def gold(sc: Scenario, call: Call) -> str:
    """Search for the entity the question names, read its document until the fact shows, answer
    and cite. Two-hop questions go through the company's page to its town's. Every id and name it
    passes to a tool was shown to it first (in the question or a tool result)."""
    exp = sc["expected"]
    value = exp["answer"]
    if "via" in exp:
        company = sc["prompt"].split("where ", 1)[1].rsplit(" is headquartered", 1)[0]
        page = _read_until(call, _find(call, company, company), "headquartered in ")
        town = page.split("headquartered in ", 1)[1].split(".", 1)[0]
        doc_id = _find(call, town, town)
    else:
        entity = _entity(sc["prompt"], exp["kind"])
        doc_id = _find(call, entity, f"{entity} (bird)" if exp["kind"] == "bird_wingspan" else entity)
    assert doc_id == exp["doc_id"], f"found {doc_id}, but the fact is in {exp['doc_id']}"
    forms = [f"{value:,}", str(value)] if isinstance(value, int) else [str(value)]  # 12,340 or a year: 1723
    text = _read_until(call, doc_id, *forms)
    shown = next((f for f in forms if f in text), None)
    assert shown is not None, f"the corpus does not state {value!r} in {doc_id}"
    return call.say(
        f"{shown} [{doc_id}]",
        f"The answer is {shown} [{doc_id}].",
        f"{shown}, according to [{doc_id}].",
        f"It is {shown} [{doc_id}].",
    )


_ENTITY = {
    "town_founded": ("the town of ", " founded"),
    "town_population": ("the town of ", "?"),
    "company_founder": ("Who founded ", "?"),
    "company_hq": ("In which town is ", " headquartered"),
    "bird_wingspan": ("wingspan of the ", ", in"),
}


def _entity(prompt: str, kind: str) -> str:
    """The name a question asks about, cut out of its wording (see `make_scenarios`)."""
    before, after = _ENTITY[kind]
    return prompt.split(before, 1)[1].split(after, 1)[0]


def bad(sc: Scenario) -> list[Solver]:
    """An agent that cites without answering, one that lists candidates, one that reads the look-alike."""
    exp = sc["expected"]

    def cite_only(s: Scenario, call: Call) -> str:
        call("search", {"query": s["prompt"]})
        return f"See [{exp['doc_id']}]."

    def hedge(s: Scenario, call: Call) -> str:
        return f"It is one of: {exp['answer']}, " + ", ".join(str(w) for w in exp["wrong"][:5]) + " or 1900."

    def look_alike(s: Scenario, call: Call) -> str:
        return f"{exp['wrong'][0] if exp['wrong'] else 'unknown'} [{exp['doc_id']}]"

    return [cite_only, hedge, look_alike]


SPEC = EnvSpec(
    name="corpus_search",
    description="Question answering over a generated corpus through noisy, truncated retrieval under a time budget.",
    system_prompt=SYSTEM,
    build_seed=build_seed,
    make_scenarios=make_scenarios,
    tools=TOOLS,
    grade=grade,
    gold=gold,
    bad=bad,
    limits=Limits(max_turns=10, latency_budget_s=12.0),
)
