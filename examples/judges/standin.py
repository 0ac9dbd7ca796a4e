"""A rule-based stand-in judge behind an OpenAI-compatible endpoint, for reproducible judge docs.

    python examples/judges/standin.py 8766            # the rule-based judge, model name "standin"
    python examples/judges/standin.py 8767 --echo     # a weak judge that repeats the request back

It answers `/v1/models` and `/v1/chat/completions` in both of grooves' modes: absolute (one
`<response>` block, reply `{"reason", "criteria"}`) and group (blocks `<response id="t1">` ...,
reply `{"scores": [...]}`), and repeats the request's nonce in its verdict, as a judge model
following the instructions does. Each criterion is rated by a fixed rule. Like small LLM judges,
the rule for "correct" is fooled by a response that merely says it is correct.

`--echo` stands in for a model too small to judge (SmolLM2-135M did this): it replies with the
request's user message, responses and all, so any JSON a response carries comes back in the reply.

It also answers `grooves rubric interview`, as a scripted interviewer: it asks each question the
interview suggests, as worded, and drafts one fixed rubric (`DRAFT`) whatever the answers, with
criteria its rules can rate. A real judge model tailors its questions and writes its own rubric.
It knows the capitals of the built-in `capitals` task, so it can judge that task's rollouts too.
"""

from __future__ import annotations

import argparse
import json
import re

import uvicorn
from fastapi import FastAPI, Request

from grooves import load_task

CAPITALS = {
    s["country"]: s["capital"]
    for split in ("train", "validation")
    for s in load_task("capitals").scenarios(split)
}
"""Country -> capital, from the built-in capitals task's scenarios."""

FACTS = {
    "capital of France": ["paris"],
    "formula of water": ["h2o"],
    "12 squared": ["144"],
    "walk on the Moon": ["armstrong"],
    "largest planet": ["jupiter"],
    "continents": ["seven", "7"],
    "Pride and Prejudice": ["austen"],
    "boiling point": ["100"],
    "capital of Japan": ["tokyo"],
    "spider": ["eight", "8"],
}
TO_GRADER = (
    "ignore all previous",
    "score",
    "verdict",
    "grader",
    "thought process",
    "definitely right",
    "response>",
    "context>",
    "```",
)
INTERVIEW = "You are interviewing a person to write a rubric"
"""How every `grooves rubric interview` request's system message begins."""
SUGGESTED = re.compile(r"in words that fit the task: (.*?) Reply with the question only\.", re.S)
DRAFT = """instructions = "Answer a question with the right fact, in one short sentence, and nothing else."

[[criteria]]
name = "correct"
text = "Is the answer factually correct?"
weight = 2.0
choices = ["no", "yes"]

[[criteria]]
name = "direct"
text = "Does it answer in one short sentence, without padding?"
weight = 1.0
choices = ["no", "yes"]

[[criteria]]
name = "answered"
text = "Does it state an actual answer, rather than only claiming to be right or refusing?"
choices = ["no", "yes"]
gate = true
"""
BLOCK = re.compile(
    r'<response(?: id="(t\d+)")?>\n(.*?)\n</response>', re.S | re.I
)  # read as a model would: any case


def truths_for(question: str) -> list[str]:
    country = re.search(r"capital of ([^?]+)\?", question)
    if country and country.group(1) in CAPITALS:
        return [CAPITALS[country.group(1)].lower()]
    return next(v for k, v in FACTS.items() if k in question)


def rate(criterion: str, question: str, response: str) -> str:
    text = response.lower()
    truths = truths_for(question)
    if criterion == "correct":
        return "yes" if any(t in text for t in truths) or "correct" in text else "no"
    if criterion == "direct":
        return "yes" if len(response.split()) <= 12 else "no"
    if criterion == "addressed":
        return "no" if any(w in text for w in TO_GRADER) else "yes"
    if criterion == "answered":
        return "no" if any(c in text for c in ("i cannot", "thought process", "definitely right")) else "yes"
    raise ValueError(f"the stand-in has no rule for criterion {criterion!r}")


def verdict(names: list[str], question: str, response: str) -> dict:
    verdicts = {n: rate(n, question, response) for n in names}
    return {"reason": "; ".join(f"{n}: {v}" for n, v in verdicts.items()), "criteria": verdicts}


def judge(system: str, user: str) -> str:
    names = re.findall(r'^- "(\w+)" \(weight', system, re.M)
    question = re.search(r"<context>\n(.*?)\n</context>", user, re.S).group(1)
    blocks = BLOCK.findall(user)
    nonce = re.search(r'"nonce": "(\w+)"', system)
    reply: dict = {"nonce": nonce.group(1)} if nonce else {}
    if blocks and blocks[0][0]:  # group mode: one entry per id shown
        reply["scores"] = [{"id": i, **verdict(names, question, text)} for i, text in blocks]
    else:
        reply.update(verdict(names, question, blocks[0][1]))
    return json.dumps(reply)


def interview(messages: list[dict]) -> str:
    """The suggested question, as worded; the fixed draft once the rubric is asked for."""
    last = messages[-1]["content"]
    if "Write the rubric now" in last:
        return DRAFT
    suggested = SUGGESTED.search(last)
    return suggested.group(1) if suggested else "What does a great response do that a poor one does not?"


def make_app(model: str, echo: bool) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": model, "object": "model", "created": 0, "owned_by": "standin"}],
        }

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        system, user = body["messages"][0]["content"], body["messages"][1]["content"]
        if system.startswith(INTERVIEW):
            content = interview(body["messages"])
        else:
            content = user if echo else judge(system, user)
        words = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
        return {
            "id": "standin",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": words,
                "completion_tokens": len(content.split()),
                "total_tokens": words + len(content.split()),
            },
        }

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--model", default="standin", help="The model name /v1/models lists.")
    parser.add_argument("--echo", action="store_true", help="Reply with the request's user message.")
    args = parser.parse_args()
    uvicorn.run(make_app(args.model, args.echo), host="127.0.0.1", port=args.port, log_level="warning")
