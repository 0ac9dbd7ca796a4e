"""Issue tracker: a Jira-like board where the agent finds, creates, updates, links and moves issues.

Requests name issues by title, never by key, so the agent has to search (titles are close to each
other on purpose). Status changes follow a workflow the tool enforces one edge at a time, so
closing an issue can take several calls. The grader reads the final board: each requested change
is a requirement, and touching any issue the request did not mention zeroes the score.
"""

from __future__ import annotations

import random
import sqlite3
from typing import Any

from grooves.envs.base import Grade, Limits, Scenario
from grooves.envs.builtin.answers import mentions
from grooves.envs.sqlite import SCENARIOS, TEST_SCENARIOS, Call, EnvSpec, GradeInput, Solver, assign_splits
from grooves.envs.state import changed_keys, like_pattern
from grooves.envs.tools import Tool, ToolContext, ToolError, obj, string

WORKFLOW = {
    "todo": ["in_progress"],
    "in_progress": ["in_review", "todo"],
    "in_review": ["done", "in_progress"],
    "done": ["todo"],
}
PATH_TO_DONE = {
    "todo": ["in_progress", "in_review", "done"],
    "in_progress": ["in_review", "done"],
    "in_review": ["done"],
    "done": [],
}
PROJECTS = {"WEB": "Web app", "API": "Public API", "MOB": "Mobile apps", "OPS": "Operations"}
TYPES, PRIORITIES = ["bug", "task", "story"], ["low", "medium", "high", "critical"]
LINK_KINDS = ["blocks", "relates_to", "duplicates"]

SYSTEM = (
    "You manage issues on a team's tracker. Use the tools to find issues (requests name them by "
    "title), then make exactly the requested changes and nothing else. Status moves one step at a "
    "time along the workflow: todo -> in_progress -> in_review -> done (in_review can go back to "
    "in_progress, in_progress back to todo, done back to todo). Finish with a short confirmation "
    "that names the issue keys you changed or created."
)

_VERBS = ["Fix", "Add", "Remove", "Refactor", "Document", "Speed up", "Test"]
_OBJECTS = [
    "login timeout",
    "search results page",
    "payment retry",
    "CSV export",
    "dark mode",
    "push notifications",
    "rate limiter",
    "audit log",
    "password reset",
    "image upload",
    "session cache",
    "billing webhook",
]
_PLACES = [
    "on Safari",
    "on Android",
    "for admins",
    "in staging",
    "for new users",
    "in the API",
    "on iOS",
    "for EU customers",
]
_PEOPLE = [
    "Amara Chen",
    "Bruno Costa",
    "Dana Whitfield",
    "Emeka Obi",
    "Farah Aziz",
    "Goran Petrov",
    "Hana Sato",
    "Ivan Horvat",
    "Julia Berg",
    "Kofi Mensah",
    "Lena Fischer",
    "Marco Rossi",
    "Nadia Karim",
    "Oskar Nilsson",
    "Priya Nair",
]

_SCHEMA = """
CREATE TABLE projects (key TEXT PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE users (id TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT UNIQUE NOT NULL);
CREATE TABLE issues (key TEXT PRIMARY KEY, project TEXT NOT NULL REFERENCES projects(key), number INTEGER NOT NULL,
  title TEXT NOT NULL, description TEXT NOT NULL, type TEXT NOT NULL, status TEXT NOT NULL,
  priority TEXT NOT NULL, assignee TEXT REFERENCES users(id), UNIQUE (project, number));
CREATE TABLE links (id INTEGER PRIMARY KEY, from_key TEXT NOT NULL REFERENCES issues(key), kind TEXT NOT NULL,
  to_key TEXT NOT NULL REFERENCES issues(key), UNIQUE (from_key, kind, to_key));
CREATE TABLE comments (id INTEGER PRIMARY KEY, issue_key TEXT NOT NULL REFERENCES issues(key), body TEXT NOT NULL);
"""


def _all_titles() -> list[str]:
    return [f"{v} {o} {p}" for v in _VERBS for o in _OBJECTS for p in _PLACES]


def build_seed(conn: sqlite3.Connection, seed: int) -> None:
    """4 projects, 15 users, 240 issues with unique titles, 60 links; all from `seed`."""
    rng = random.Random(f"issue_tracker:{seed}")
    conn.executescript(_SCHEMA)
    conn.executemany("INSERT INTO projects VALUES (?,?)", list(PROJECTS.items()))
    users = [(f"u{i:02d}", n, n.lower().replace(" ", ".") + "@example.com") for i, n in enumerate(_PEOPLE, 1)]
    conn.executemany("INSERT INTO users VALUES (?,?,?)", users)
    numbers = dict.fromkeys(PROJECTS, 0)
    issues = []
    for title in rng.sample(_all_titles(), 240):
        project = rng.choice(list(PROJECTS))
        numbers[project] += 1
        assignee = rng.choice(users)[0] if rng.random() < 0.7 else None
        issues.append(
            (
                f"{project}-{numbers[project]}",
                project,
                numbers[project],
                title,
                f"Reported: {title.lower()}.",
                rng.choice(TYPES),
                rng.choice(list(WORKFLOW)),
                rng.choice(PRIORITIES),
                assignee,
            )
        )
    conn.executemany("INSERT INTO issues VALUES (?,?,?,?,?,?,?,?,?)", issues)
    pairs = {(rng.choice(issues)[0], rng.choice(LINK_KINDS), rng.choice(issues)[0]) for _ in range(60)}
    conn.executemany(
        "INSERT INTO links (from_key, kind, to_key) VALUES (?,?,?)", [p for p in pairs if p[0] != p[2]]
    )


# ---- tools -------------------------------------------------------------------------------------

_COLUMNS = "key, title, type, status, priority, assignee"


def _issue(ctx: ToolContext, key: str) -> dict[str, Any]:
    row = ctx.state.one(f"SELECT {_COLUMNS}, description FROM issues WHERE key = ?", (key.strip().upper(),))
    if row is None:
        raise ToolError(f"no issue {key!r}")
    return row


def _search(ctx: ToolContext, a: dict[str, Any]) -> Any:
    clauses, params = ["title LIKE ? ESCAPE '\\'"], [like_pattern(a.get("query", ""))]
    for field in ("project", "status", "assignee"):
        if field in a:
            clauses.append(f"{field} = ?")  # the column names are ours; only the values come from the model
            params.append(a[field])
    rows = ctx.state.query(
        f"SELECT {_COLUMNS} FROM issues WHERE {' AND '.join(clauses)} ORDER BY key LIMIT 10", params
    )
    return {"issues": rows}


def _get(ctx: ToolContext, a: dict[str, Any]) -> Any:
    issue = _issue(ctx, a["key"])
    issue["links"] = ctx.state.query(
        "SELECT from_key, kind, to_key FROM links WHERE from_key = ? OR to_key = ?",
        (issue["key"], issue["key"]),
    )
    issue["comments"] = [
        r["body"] for r in ctx.state.query("SELECT body FROM comments WHERE issue_key = ?", (issue["key"],))
    ]
    issue["allowed_transitions"] = WORKFLOW[issue["status"]]
    return issue


def _find_user(ctx: ToolContext, a: dict[str, Any]) -> Any:
    return {
        "users": ctx.state.query(
            "SELECT id, name, email FROM users WHERE name LIKE ? ESCAPE '\\' LIMIT 10",
            (like_pattern(a["name"]),),
        )
    }


def _create(ctx: ToolContext, a: dict[str, Any]) -> Any:
    with ctx.state.conn:
        number = ctx.state.conn.execute(
            "SELECT coalesce(max(number), 0) + 1 FROM issues WHERE project = ?", (a["project"],)
        ).fetchone()[0]
        key = f"{a['project']}-{number}"
        ctx.state.conn.execute(
            "INSERT INTO issues VALUES (?,?,?,?,?,?,?,?,NULL)",
            (
                key,
                a["project"],
                number,
                a["title"],
                a.get("description", ""),
                a["type"],
                "todo",
                a["priority"],
            ),
        )
    return {"created": key}


def _update(ctx: ToolContext, a: dict[str, Any]) -> Any:
    issue = _issue(ctx, a["key"])
    fields = {f: a[f] for f in ("title", "priority", "assignee") if f in a}
    if not fields:
        raise ToolError("nothing to update: give title, priority or assignee")
    if (
        "assignee" in fields
        and ctx.state.one("SELECT id FROM users WHERE id = ?", (fields["assignee"],)) is None
    ):
        raise ToolError(f"no user {fields['assignee']!r}; find_user gives user ids")
    with ctx.state.conn:
        for field, value in fields.items():
            ctx.state.conn.execute(f"UPDATE issues SET {field} = ? WHERE key = ?", (value, issue["key"]))
    return {"updated": issue["key"], **fields}


def _link(ctx: ToolContext, a: dict[str, Any]) -> Any:
    src, dst = _issue(ctx, a["from_key"])["key"], _issue(ctx, a["to_key"])["key"]
    if src == dst:
        raise ToolError("an issue cannot link to itself")
    try:
        ctx.state.execute("INSERT INTO links (from_key, kind, to_key) VALUES (?,?,?)", (src, a["kind"], dst))
    except sqlite3.IntegrityError:
        raise ToolError(f"{src} already {a['kind']} {dst}") from None
    return {"linked": f"{src} {a['kind']} {dst}"}


def _transition(ctx: ToolContext, a: dict[str, Any]) -> Any:
    issue = _issue(ctx, a["key"])
    if a["status"] not in WORKFLOW[issue["status"]]:
        raise ToolError(
            f"{issue['key']} is {issue['status']}; it can move to {WORKFLOW[issue['status']]} only"
        )
    ctx.state.execute("UPDATE issues SET status = ? WHERE key = ?", (a["status"], issue["key"]))
    return {"key": issue["key"], "status": a["status"], "allowed_next": WORKFLOW[a["status"]]}


def _comment(ctx: ToolContext, a: dict[str, Any]) -> Any:
    key = _issue(ctx, a["key"])["key"]
    ctx.state.execute("INSERT INTO comments (issue_key, body) VALUES (?,?)", (key, a["body"]))
    return {"commented": key}


_KEY = string("issue key, e.g. WEB-12", 12)
_PROJECT = string("project key", 4, enum=list(PROJECTS))
_STATUS = string("status", 12, enum=list(WORKFLOW))
_PRIORITY = string("priority", 10, enum=PRIORITIES)
_USER = string("user id from find_user, e.g. u03", 4)
TOOLS = [
    Tool(
        "search_issues",
        "Find issues whose title contains the query, optionally filtered.",
        obj(
            {
                "query": string("part of a title", 120),
                "project": _PROJECT,
                "status": _STATUS,
                "assignee": _USER,
            }
        ),
        _search,
    ),
    Tool(
        "get_issue",
        "One issue with its links, comments and allowed status moves.",
        obj({"key": _KEY}, ["key"]),
        _get,
    ),
    Tool(
        "find_user", "Find users by name.", obj({"name": string("part of a name", 60)}, ["name"]), _find_user
    ),
    Tool(
        "create_issue",
        "Create an issue (starts in todo).",
        obj(
            {
                "project": _PROJECT,
                "title": string("title", 200),
                "type": string("type", 8, enum=TYPES),
                "priority": _PRIORITY,
                "description": string("description", 2000),
            },
            ["project", "title", "type", "priority"],
        ),
        _create,
        latency_s=0.4,
    ),
    Tool(
        "update_issue",
        "Change an issue's title, priority or assignee.",
        obj(
            {"key": _KEY, "title": string("new title", 200), "priority": _PRIORITY, "assignee": _USER},
            ["key"],
        ),
        _update,
        latency_s=0.3,
    ),
    Tool(
        "link_issues",
        "Link two issues: from_key <kind> to_key.",
        obj(
            {"from_key": _KEY, "kind": string("link kind", 12, enum=LINK_KINDS), "to_key": _KEY},
            ["from_key", "kind", "to_key"],
        ),
        _link,
        latency_s=0.3,
    ),
    Tool(
        "transition_issue",
        "Move an issue one step along the workflow.",
        obj({"key": _KEY, "status": _STATUS}, ["key", "status"]),
        _transition,
        latency_s=0.3,
    ),
    Tool(
        "add_comment",
        "Comment on an issue.",
        obj({"key": _KEY, "body": string("comment", 2000)}, ["key", "body"]),
        _comment,
    ),
]

# ---- scenarios ---------------------------------------------------------------------------------


def make_scenarios(
    conn: sqlite3.Connection, seed: int, count: int = SCENARIOS + TEST_SCENARIOS
) -> list[Scenario]:
    """File-and-link, reassign, close and mark-duplicate requests, naming issues by title."""
    rng = random.Random(f"issue_tracker:scenarios:{seed}")
    issues = [
        dict(zip(("key", "title", "status", "priority", "assignee", "project"), r, strict=True))
        for r in conn.execute(
            "SELECT key, title, status, priority, assignee, project FROM issues ORDER BY key"
        )
    ]
    users = conn.execute("SELECT id, name FROM users ORDER BY id").fetchall()
    unused = sorted(set(_all_titles()) - {i["title"] for i in issues})
    out: list[Scenario] = []
    while len(out) < count:  # distinct requests: none in validation is also a train request
        kind = rng.choice(["file_blocker", "reassign", "close", "duplicate"])
        target = rng.choice([i for i in issues if i["status"] != "done"])
        if kind == "file_blocker":
            title, project, typ, prio = (
                rng.choice(unused),
                rng.choice(list(PROJECTS)),
                rng.choice(TYPES),
                rng.choice(PRIORITIES),
            )
            prompt = (
                f'File a {typ} in project {project} titled "{title}" with {prio} priority, and mark it as '
                f'blocking the issue "{target["title"]}".'
            )
            exp = {"title": title, "project": project, "type": typ, "priority": prio}
        elif kind == "reassign":
            uid, uname = rng.choice([u for u in users if u[0] != target["assignee"]])
            prio = rng.choice([p for p in PRIORITIES if p != target["priority"]])
            prompt = f'Assign "{target["title"]}" to {uname} and set its priority to {prio}.'
            exp = {"assignee": uid, "priority": prio}
        elif kind == "close":
            prompt = f'"{target["title"]}" has been fixed and verified. Move it to done.'
            exp = {}
        else:
            original = rng.choice([i for i in issues if i["key"] != target["key"]])
            prompt = (
                f'"{target["title"]}" is a duplicate of "{original["title"]}". Link it as a duplicate '
                "of that issue and move it to done."
            )
            exp = {"original": original["key"]}
        if any(sc["prompt"] == prompt for sc in out):
            continue
        out.append(
            {
                "prompt": prompt,
                "title": target["title"],
                "expected": {"kind": kind, "key": target["key"], **exp},
            }
        )
    return assign_splits("issue_tracker", out, test_from=SCENARIOS)


# ---- grader ------------------------------------------------------------------------------------


def grade(g: GradeInput) -> Grade:
    """collateral (gate) x (0.8 x fraction of requirements met + 0.2 x answer names the key)."""
    exp, before, after = g.scenario["expected"], g.seed.connection, g.state.conn
    changed = changed_keys(before, after, "issues", "key")
    created = sorted(
        k for k in changed if before.execute("SELECT 1 FROM issues WHERE key = ?", (k,)).fetchone() is None
    )
    new_links = {tuple(r) for r in after.execute("SELECT from_key, kind, to_key FROM links")} - {
        tuple(r) for r in before.execute("SELECT from_key, kind, to_key FROM links")
    }
    row = after.execute(
        "SELECT status, priority, assignee FROM issues WHERE key = ?", (exp["key"],)
    ).fetchone()
    status, priority, assignee = row if row else (None, None, None)
    kind, key, named = exp["kind"], exp["key"], exp["key"]
    if kind == "file_blocker":
        new = (
            after.execute(
                "SELECT key, project, title, type, priority FROM issues WHERE key = ?", (created[0],)
            ).fetchone()
            if len(created) == 1
            else None
        )
        named = new[0] if new else "(none created)"
        reqs = {
            "created": new is not None
            and new[2].strip().lower() == exp["title"].lower()
            and new[1] == exp["project"],
            "type": new is not None and new[3] == exp["type"],
            "priority": new is not None and new[4] == exp["priority"],
            "linked": new is not None and new_links == {(new[0], "blocks", key)},
        }
        allowed_changes, allowed_links = set(created[:1]), {(named, "blocks", key)}
    elif kind == "reassign":
        reqs = {"assignee": assignee == exp["assignee"], "priority": priority == exp["priority"]}
        allowed_changes, allowed_links = {key}, set()
    elif kind == "close":
        reqs = {"done": status == "done"}
        allowed_changes, allowed_links = {key}, set()
    else:
        reqs = {"linked": (key, "duplicates", exp["original"]) in new_links, "done": status == "done"}
        allowed_changes, allowed_links = {key}, {(key, "duplicates", exp["original"])}
    stray = sorted(changed - allowed_changes) + sorted(
        f"{a} {k} {b}" for a, k, b in new_links - allowed_links
    )
    collateral = 0.0 if stray else 1.0
    answer = float(mentions(g.answer, named))
    met = sum(reqs.values()) / len(reqs)
    parts = {"collateral": collateral, "requirements": met, "answer": answer} | {
        f"req_{k}": float(v) for k, v in reqs.items()
    }
    notes = [f"unrequested change: {s}" for s in stray] + [
        f"requirement not met: {k}" for k, v in reqs.items() if not v
    ]
    return Grade(score=collateral * (0.8 * met + 0.2 * answer), parts=parts, notes=notes)


# ---- scripted solvers --------------------------------------------------------------------------


def _find(call: Call, title: str) -> dict[str, Any]:
    return next(i for i in call("search_issues", {"query": title})["issues"] if i["title"] == title)


def gold(sc: Scenario, call: Call) -> str:
    """Search by the exact title, make the requested changes, walk the workflow, confirm. Every key
    and user id it passes to a tool was shown to it first by a search."""
    exp = sc["expected"]
    issue = _find(call, sc["title"])
    key = issue["key"]
    if exp["kind"] == "file_blocker":
        made = call(
            "create_issue",
            {
                "project": exp["project"],
                "title": exp["title"],
                "type": exp["type"],
                "priority": exp["priority"],
            },
        )["created"]
        call("link_issues", {"from_key": made, "kind": "blocks", "to_key": key})
        return call.say(
            f"Created {made} and marked it as blocking {key}.",
            f"{made} is filed and now blocks {key}.",
            f"Done: {made} was created and it blocks {key}.",
        )
    if exp["kind"] == "reassign":
        name = sc["prompt"].split(" to ", 1)[1].split(" and set", 1)[0]
        uid = call("find_user", {"name": name})["users"][0]["id"]
        call("update_issue", {"key": key, "assignee": uid, "priority": exp["priority"]})
        prio = exp["priority"]
        return call.say(
            f"{key} is now assigned to {name} with {prio} priority.",
            f"Done: {key} goes to {name}, priority {prio}.",
            f"I assigned {key} to {name} and set it to {prio}.",
        )
    if exp["kind"] == "duplicate":
        original = _find(call, sc["prompt"].split('"')[3])["key"]
        call("link_issues", {"from_key": key, "kind": "duplicates", "to_key": original})
    for status in PATH_TO_DONE[issue["status"]]:  # the search result shows its status
        call("transition_issue", {"key": key, "status": status})
    return call.say(f"{key} is done.", f"Moved {key} to done.", f"{key} is now closed (done).")


def bad(sc: Scenario) -> list[Solver]:
    """An agent that edits a look-alike issue, and one that stops after the first step."""
    exp = sc["expected"]

    def wrong_issue(s: Scenario, call: Call) -> str:
        words = s["title"].split()
        found = call("search_issues", {"query": " ".join(words[1:-2])})["issues"]
        other = next((i for i in found if i["key"] != exp["key"]), None) or _find(call, s["title"])
        key = other["key"]
        call(
            "update_issue", {"key": key, "priority": "critical" if other["priority"] != "critical" else "low"}
        )
        return f"Updated {exp['key']}."

    def first_step_only(s: Scenario, call: Call) -> str:
        key = _find(call, s["title"])["key"]
        if exp["kind"] == "file_blocker":
            call(
                "create_issue",
                {"project": exp["project"], "title": "New issue", "type": "task", "priority": "low"},
            )
        return f"All done with {key}."

    return [wrong_issue, first_step_only]


SPEC = EnvSpec(
    name="issue_tracker",
    description="A Jira-like board: find, create, update, link and transition issues.",
    system_prompt=SYSTEM,
    build_seed=build_seed,
    make_scenarios=make_scenarios,
    tools=TOOLS,
    grade=grade,
    gold=gold,
    bad=bad,
    limits=Limits(max_turns=10),
)
