"""`grooves judge score | inspect | compare`: the calibration loop on the command line.

    grooves judge score outputs.jsonl --rubric rubric.toml --out scores-v1.jsonl
    grooves judge inspect scores-v1.jsonl --k 5             # read the extremes, mark agree/disagree
    grooves judge score outputs.jsonl --rubric rubric-v2.toml --out scores-v2.jsonl
    grooves judge compare scores-v1.jsonl scores-v2.jsonl --verdicts scores-v1.verdicts.jsonl

The commands only parse flags, call `batch` / `calibration` / `html`, and print; errors in
the user's files or settings end in one red line and exit code 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import sys
from enum import StrEnum
from pathlib import Path

import typer
from rich.console import Console
from rich.prompt import Prompt
from rich.table import Table

from grooves.judge.batch import ScoreRecord, read_items, read_records, score_items, write_records
from grooves.judge.calibration import (
    Verdict,
    agreement,
    append_verdicts,
    extremes,
    import_verdicts,
    latest_verdicts,
    make_verdict,
    person_agreement,
    read_verdicts,
    rubric_tag,
)
from grooves.judge.client import JudgeClient, JudgeConfig, TokenUsage
from grooves.judge.errors import JudgeError
from grooves.judge.html import compare_page, inspect_page
from grooves.judge.rubric import DEFAULT_RUBRIC, RubricError, load_rubric

app = typer.Typer(no_args_is_help=True, add_completion=False, help="LLM judges: score, inspect, compare.")
console = Console()


class Mode(StrEnum):
    absolute = "absolute"
    group = "group"


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(1)


def _fmt(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.3f}"


async def _score(config: JudgeConfig, input_path: Path, rubric_path: Path | None, mode: Mode, twice: bool,
                 seed: int) -> tuple[list[ScoreRecord], TokenUsage]:
    rubric = load_rubric(rubric_path) if rubric_path else DEFAULT_RUBRIC
    items = read_items(input_path)
    client = JudgeClient(config)
    try:
        records = await score_items(client, rubric, items, mode=mode.value, judge_twice=twice, seed=seed)
    finally:
        await client.aclose()
    return records, client.usage


@app.command()
def score(
    input_path: Path = typer.Argument(..., metavar="INPUT", help="JSONL of {id, input, output}, or a run's trajectories."),
    out: Path = typer.Option(..., "--out", "-o", help="Scores JSONL to write."),
    rubric: Path | None = typer.Option(None, help="Rubric TOML (default: one 'overall' criterion)."),
    mode: Mode = typer.Option(Mode.absolute, help="absolute: each item alone; group: items sharing an input side by side."),
    twice: bool = typer.Option(False, help="Group mode: judge again in reversed order, report position bias."),
    seed: int = typer.Option(0, help="Seed of the display shuffle in group mode."),
    base_url: str | None = typer.Option(None, help="Judge endpoint (env GROOVES_JUDGE_BASE_URL)."),
    model: str | None = typer.Option(None, help="Judge model (env GROOVES_JUDGE_MODEL)."),
    api_key: str | None = typer.Option(None, help="API key (env GROOVES_JUDGE_API_KEY)."),
    cache: Path | None = typer.Option(None, help="Cache file (default $GROOVES_HOME/judge-cache.sqlite)."),
    no_cache: bool = typer.Option(False, help="Do not read or write the cache."),
    concurrency: int = typer.Option(8, min=1, help="Requests in flight at once."),
    timeout: float = typer.Option(60.0, min=0.001, help="Per-request timeout in seconds."),
    max_tokens: int = typer.Option(1024, min=16, help="Longest judge reply; group mode needs room for N reasons."),
) -> None:
    """Score a batch of outputs with a rubric; write one record per item."""
    settings: dict[str, object] = {"base_url": base_url, "model": model, "api_key": api_key,
                                   "concurrency": concurrency, "timeout_s": timeout, "max_tokens": max_tokens}
    if no_cache or cache is not None:
        settings["cache_path"] = None if no_cache else cache
    try:
        config = JudgeConfig.model_validate(settings)
        records, usage = asyncio.run(_score(config, input_path, rubric, mode, twice, seed))
    except (RubricError, JudgeError, ValueError, FileNotFoundError) as exc:
        raise _fail(str(exc)) from exc
    write_records(out, records)
    _print_score_summary(records, usage, out)


def _print_score_summary(records: list[ScoreRecord], usage: TokenUsage, out: Path) -> None:
    scored = [r.score for r in records if r.score is not None]
    biases = [r.position_bias for r in records if r.position_bias is not None]
    table = Table(title=f"scored with {rubric_tag(records) if records else '-'}", show_header=False)
    rows = [
        ("items", str(len(records))), ("scored", str(len(scored))), ("failed", str(len(records) - len(scored))),
        ("mean score", _fmt(statistics.fmean(scored) if scored else None)),
        ("judge requests", str(usage.requests)), ("cache hits", str(usage.cache_hits)),
        ("prompt tokens", str(usage.prompt_tokens)), ("completion tokens", str(usage.completion_tokens)),
    ]
    if biases:
        rows.append(("mean position bias |A-B|", _fmt(statistics.fmean(biases))))
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
    for r in records:
        if r.error:
            console.print(f"[yellow]failed[/yellow] {r.id}: {r.error}", highlight=False, soft_wrap=True)
    console.print(f"wrote {out}")


def _extremes_table(title: str, records: list[ScoreRecord], verdicts: dict[str, Verdict]) -> Table:
    table = Table(title=title, show_lines=True)
    for col in ("id", "score", "criteria", "reason", "output", "verdict"):
        table.add_column(col, overflow="fold")
    for r in records:
        crit = "\n".join(f"{k} {v:.2f}" for k, v in r.criteria.items())
        out = r.output if len(r.output) <= 240 else r.output[:240] + "…"
        v = verdicts.get(r.id)
        mark = "" if v is None else ("agree" if v.agree else "disagree") + (f": {v.note}" if v.note else "")
        table.add_row(r.id, _fmt(r.score), crit, r.reason, out, mark)
    return table


def _ask_verdicts(shown: list[ScoreRecord], records: list[ScoreRecord]) -> list[Verdict]:
    marked = []
    for r in shown:
        answer = Prompt.ask(f"{r.id} (score {_fmt(r.score)}): agree with the judge?",
                            choices=["a", "d", "s", "q"], default="s", console=console)
        if answer == "q":
            break
        if answer == "s":
            continue
        note = Prompt.ask("note", default="", console=console)
        marked.append(make_verdict(r, records, answer == "a", note))
    return marked


@app.command()
def inspect(
    scores: Path = typer.Argument(..., help="Scores JSONL from `grooves judge score`."),
    k: int = typer.Option(5, min=1, help="Show the k highest and k lowest."),
    verdicts: Path | None = typer.Option(None, help="Import verdicts {id, agree, note} from this JSONL instead of asking."),
    store: Path | None = typer.Option(None, help="Verdicts file to keep (default SCORES.verdicts.jsonl)."),
    html: Path | None = typer.Option(None, help="Also write an HTML page here."),
    prompt: bool | None = typer.Option(None, "--prompt/--no-prompt",
                                       help="Ask agree/disagree for each shown item (default: when stdin is a terminal)."),
) -> None:
    """Show the highest and lowest k with the judge's reasons; record agree/disagree verdicts."""
    store = store or scores.with_suffix(".verdicts.jsonl")
    try:
        records = read_records(scores)
        tag = rubric_tag(records)
        top, bottom = extremes(records, k)
        kept = read_verdicts(store)
        new = import_verdicts(records, verdicts) if verdicts else []
    except (ValueError, FileNotFoundError) as exc:
        raise _fail(str(exc)) from exc
    shown = latest_verdicts(kept + new)
    console.print(_extremes_table(f"highest {len(top)} ({tag})", top, shown))
    console.print(_extremes_table(f"lowest {len(bottom)}", bottom, shown))
    if not verdicts and (sys.stdin.isatty() if prompt is None else prompt):
        new = _ask_verdicts(top + bottom, records)
    if new:
        append_verdicts(store, new)
        console.print(f"kept {len(new)} verdicts in {store} "
                      f"({sum(v.agree for v in new)} agree, {sum(not v.agree for v in new)} disagree)")
    if html:
        html.write_text(inspect_page(tag, records, top, bottom, latest_verdicts(kept + new)), encoding="utf-8")
        console.print(f"wrote {html}")


@app.command()
def compare(
    a: Path = typer.Argument(..., help="Scores JSONL of rubric version A."),
    b: Path = typer.Argument(..., help="Scores JSONL of rubric version B."),
    verdicts: Path | None = typer.Option(None, help="A verdicts file kept by `inspect`."),
    threshold: float = typer.Option(0.5, help="Score at or above which an item counts as judged good."),
    html: Path | None = typer.Option(None, help="Also write an HTML page here."),
) -> None:
    """Agreement between two rubric versions' scores, and with a person's verdicts."""
    try:
        ra, rb = read_records(a), read_records(b)
        tag_a, tag_b = rubric_tag(ra), rubric_tag(rb)
        if verdicts and not verdicts.exists():
            raise FileNotFoundError(f"verdicts file not found: {verdicts}")
        marks = read_verdicts(verdicts) if verdicts else []
    except (ValueError, FileNotFoundError) as exc:
        raise _fail(str(exc)) from exc
    agree = agreement(ra, rb)
    console.print(f"A = {tag_a}  ({a})\nB = {tag_b}  ({b})", highlight=False, soft_wrap=True)
    table = Table(title="rubric agreement, items scored by both")
    for col in ("items", "Pearson", "Spearman", "mean |A-B|"):
        table.add_column(col)
    table.add_row(str(agree.n), _fmt(agree.pearson), _fmt(agree.spearman), _fmt(agree.mean_abs_diff))
    console.print(table)
    person = None
    if marks:
        person = (person_agreement(ra, marks, threshold), person_agreement(rb, marks, threshold))
        pt = Table(title=f"agreement with the person's verdicts (judged good = score >= {threshold:g})")
        for col in ("rubric", "verdicts", "agree fraction", "mean score of 'good'", "mean score of 'bad'"):
            pt.add_column(col)
        for name, p in zip("AB", person, strict=True):
            pt.add_row(name, str(p.n), _fmt(p.agree_fraction), _fmt(p.mean_score_good), _fmt(p.mean_score_bad))
        console.print(pt)
    if html:
        html.write_text(compare_page(tag_a, tag_b, agree, ra, rb, person, latest_verdicts(marks)), encoding="utf-8")
        console.print(f"wrote {html}")
