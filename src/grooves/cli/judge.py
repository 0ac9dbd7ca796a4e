"""`grooves judge score | inspect | compare`: the calibration loop on the command line.

    grooves judge score outputs.jsonl --rubric rubric.toml --out scores-v1.jsonl
    grooves judge inspect scores-v1.jsonl --k 5             # read the extremes, mark agree/disagree
    grooves judge score outputs.jsonl --rubric rubric-v2.toml --out scores-v2.jsonl
    grooves judge compare scores-v1.jsonl scores-v2.jsonl --verdicts scores-v1.verdicts.jsonl

The commands only parse flags, call `batch` / `calibration` / `html`, and print; errors in
the user's files or settings end in one red line and exit code 1, never a traceback. Every mean
is printed with the count it rests on ("0.660 over 38/40"), and `score` exits 1 when fewer items
than `--min-coverage` were scored. Text from files and models is escaped before Rich prints it,
so `[user]` or `[[criteria]]` is shown, not read as markup.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.prompt import Prompt
from rich.table import Table

from grooves.judge.batch import (
    Coverage,
    ScoreRecord,
    check_retry,
    merge,
    read_items,
    read_records,
    score_items,
    to_retry,
    write_records,
)
from grooves.judge.calibration import (
    Verdict,
    agreement,
    append_verdicts,
    extremes,
    import_verdicts,
    judge_tag,
    labelled,
    latest_verdicts,
    make_verdict,
    person_agreement,
    read_verdicts,
    rubric_tag,
    ties,
)
from grooves.judge.endpoint import JudgeClient, JudgeConfig, TokenUsage
from grooves.judge.errors import JudgeError
from grooves.judge.html import compare_page, inspect_page
from grooves.judge.rubric import DEFAULT_RUBRIC, RubricError, load_rubric

app = typer.Typer(no_args_is_help=True, add_completion=False, help="LLM judges: score, inspect, compare.")
console = Console()

FEW_SCORED = 0.9
"""`compare` warns when a side scored less than this fraction of its items."""
FEW_PAIRED = 10
"""`compare` warns when fewer items than this were scored by both sides."""


class Mode(StrEnum):
    absolute = "absolute"
    group = "group"


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(1)


def _fmt(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.3f}"


def _ids(ids: list[str], shown: int = 4) -> str:
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(ids[:shown]) + more


@dataclass(frozen=True)
class ScoreJob:
    """What `grooves judge score` was asked to score and how; the judge endpoint is a `JudgeConfig`."""

    input_path: Path
    out: Path
    rubric: Path | None
    mode: Mode
    twice: bool
    seed: int
    check: bool
    stop_after: int
    retry_failed: bool
    min_coverage: float

    @property
    def retry_from(self) -> Path | None:
        """The scores file whose failed items are asked again (`--retry-failed`), else None."""
        return self.out if self.retry_failed else None


def run_score(job: ScoreJob, judge: dict[str, object]) -> None:
    """Score, write `job.out`, print the summary; a bad file or setting (in `judge`, the
    `JudgeConfig` fields) ends in one red line and exit 1, as does coverage below `min_coverage`."""
    try:
        config = JudgeConfig.model_validate(judge)
        records, usage, asked = asyncio.run(_score(config, job))
    except (RubricError, JudgeError, ValueError, FileNotFoundError) as exc:
        raise _fail(str(exc)) from exc
    write_records(job.out, records)
    coverage = _print_score_summary(records, usage, job.out, asked if job.retry_failed else None)
    if coverage.fraction < job.min_coverage:
        failed = coverage.total - coverage.scored
        raise _fail(
            f"{coverage.scored}/{coverage.total} items scored ({coverage.fraction:.0%}), below --min-coverage "
            f"{job.min_coverage:.0%}; re-ask the {failed} failed with --retry-failed (failures are not cached)"
        )


async def _score(config: JudgeConfig, job: ScoreJob) -> tuple[list[ScoreRecord], TokenUsage, int]:
    """Score the items (only the failed ones of `job.retry_from`); returns the records, usage, items asked."""
    rubric = load_rubric(job.rubric) if job.rubric else DEFAULT_RUBRIC
    items = read_items(job.input_path)
    if not items:
        raise ValueError(f"{job.input_path}: no items to score")
    client = JudgeClient(config)
    try:
        previous: list[ScoreRecord] = []
        ask = items
        retry_from = job.retry_from
        if retry_from is not None:
            if not retry_from.exists():
                raise FileNotFoundError(
                    f"--retry-failed: {retry_from} does not exist yet; score without --retry-failed first"
                )
            previous = read_records(retry_from)
            check_retry(previous, rubric, client.model, job.mode.value, retry_from)
            ask = to_retry(items, previous, job.mode.value)
        if job.check and ask:
            await client.check()
        fresh = (
            await score_items(
                client,
                rubric,
                ask,
                mode=job.mode.value,
                judge_twice=job.twice,
                seed=job.seed,
                stop_after=job.stop_after,
            )
            if ask
            else []
        )
    finally:
        await client.aclose()
    return merge(items, previous, fresh), client.usage, len(ask)


@app.command()
def score(
    input_path: Path = typer.Argument(
        ..., metavar="INPUT", help="JSONL of {id, input, output}, or a run's trajectories."
    ),
    out: Path = typer.Option(..., "--out", "-o", help="Scores JSONL to write."),
    rubric: Path | None = typer.Option(None, help="Rubric TOML (default: one 'overall' criterion)."),
    mode: Mode = typer.Option(
        Mode.absolute, help="absolute: each item alone; group: items sharing an input side by side."
    ),
    twice: bool = typer.Option(
        False, help="Group mode: judge again in reversed order, report position bias."
    ),
    seed: int = typer.Option(0, help="Seed of the display shuffle in group mode."),
    base_url: str | None = typer.Option(
        None, help="Judge endpoint, ending in /v1 (env GROOVES_JUDGE_BASE_URL)."
    ),
    model: str | None = typer.Option(None, help="Judge model (env GROOVES_JUDGE_MODEL)."),
    api_key: str | None = typer.Option(None, help="API key (env GROOVES_JUDGE_API_KEY)."),
    cache: Path | None = typer.Option(None, help="Cache file (default $GROOVES_HOME/judge-cache.sqlite)."),
    no_cache: bool = typer.Option(False, help="Do not read or write the cache."),
    concurrency: int = typer.Option(8, min=1, help="Requests in flight at once."),
    timeout: float = typer.Option(60.0, min=0.001, help="Per-request timeout in seconds."),
    max_tokens: int = typer.Option(
        1024, min=16, help="Longest judge reply; group mode needs room for N reasons."
    ),
    min_coverage: float = typer.Option(
        1.0,
        min=0.0,
        max=1.0,
        help="Exit 1 when fewer than this fraction of items were scored (the file is still written).",
    ),
    retry_failed: bool = typer.Option(
        False, help="Re-ask only the items --out holds no score for (their whole group in group mode)."
    ),
    stop_after: int = typer.Option(
        3, min=0, help="Stop sending after this many identical failures in a row (0: never)."
    ),
    check: bool = typer.Option(
        True, "--check/--no-check", help="Ask the endpoint's /models for the judge model before scoring."
    ),
) -> None:
    """Score a batch of outputs with a rubric; write one record per item.

    Failed judgments are written as records with an error and are not cached, so a later run asks
    (and pays for) them again; --retry-failed asks only those.
    """
    judge: dict[str, object] = {
        "base_url": base_url,
        "model": model,
        "api_key": api_key,
        "concurrency": concurrency,
        "timeout_s": timeout,
        "max_tokens": max_tokens,
    }
    if no_cache or cache is not None:
        judge["cache_path"] = None if no_cache else cache
    job = ScoreJob(
        input_path=input_path,
        out=out,
        rubric=rubric,
        mode=mode,
        twice=twice,
        seed=seed,
        check=check,
        stop_after=stop_after,
        retry_failed=retry_failed,
        min_coverage=min_coverage,
    )
    run_score(job, judge)


def _print_score_summary(
    records: list[ScoreRecord], usage: TokenUsage, out: Path, asked: int | None
) -> Coverage:
    coverage = Coverage.of(records)
    biases = [r.position_bias for r in records if r.position_bias is not None]
    table = Table(title=escape(f"scored with {rubric_tag(records) if records else '-'}"), show_header=False)
    rows = [("items", str(len(records)))]
    if asked is not None:
        rows.append(("asked again (--retry-failed)", str(asked)))
    rows += [
        ("scored", str(coverage.scored)),
        ("failed", str(coverage.total - coverage.scored)),
        ("mean score", str(coverage)),
        ("judge requests", str(usage.requests)),
        ("cache hits", str(usage.cache_hits)),
        ("prompt tokens", str(usage.prompt_tokens)),
        ("completion tokens", str(usage.completion_tokens)),
    ]
    if biases:
        rows.append(
            ("mean position bias |A-B|", f"{statistics.fmean(biases):.3f} over {len(biases)}/{len(records)}")
        )
    for k, v in rows:
        table.add_row(k, v)
    console.print(table)
    _print_failures(records)
    console.print(f"wrote {escape(str(out))}", highlight=False)
    return coverage


def _print_failures(records: list[ScoreRecord]) -> None:
    """One line per distinct error: a failed group, or items that failed the same way, share a line."""
    by_error: dict[str, list[str]] = {}
    for r in records:
        if r.error:
            by_error.setdefault(r.error, []).append(r.id)
    for error, ids in by_error.items():
        what = f"{ids[0]}" if len(ids) == 1 else f"{len(ids)} items ({_ids(ids)})"
        console.print(
            f"[yellow]failed[/yellow] {escape(what)}: {escape(error)}", highlight=False, soft_wrap=True
        )


def _label(v: Verdict | None) -> str:
    if v is None:
        return ""
    word = "[green]good[/green]" if v.good else "[red]bad[/red]"
    mark = "agree" if v.agree else "disagree"
    return f"{word} ({mark}{': ' + escape(v.note) if v.note else ''})"


def _records_table(title: str, records: list[ScoreRecord], verdicts: dict[str, Verdict]) -> Table:
    table = Table(title=escape(title), show_lines=True)
    for col in ("id", "score", "criteria", "reason", "output", "label"):
        table.add_column(col, overflow="fold")
    for r in records:
        crit = "\n".join(f"{k} {v:.2f}" for k, v in r.criteria.items())
        out = r.output if len(r.output) <= 240 else r.output[:240] + "…"
        table.add_row(
            escape(r.id),
            _fmt(r.score),
            escape(crit),
            escape(r.reason),
            escape(out),
            _label(verdicts.get(r.id)),
        )
    return table


def _ask_verdicts(shown: list[ScoreRecord], records: list[ScoreRecord]) -> list[Verdict]:
    marked = []
    for r in shown:
        answer = Prompt.ask(
            f"{escape(r.id)} (score {_fmt(r.score)}): agree with the judge?",
            choices=["a", "d", "s", "q"],
            default="s",
            console=console,
        )
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
    seed: int = typer.Option(0, help="Seed of the order among tied scores (which of them are shown)."),
    verdicts: Path | None = typer.Option(
        None, help="Import verdicts {id, agree, note} from this JSONL instead of asking."
    ),
    store: Path | None = typer.Option(None, help="Verdicts file to keep (default SCORES.verdicts.jsonl)."),
    html: Path | None = typer.Option(None, help="Also write an HTML page here."),
    prompt: bool | None = typer.Option(
        None,
        "--prompt/--no-prompt",
        help="Ask agree/disagree for each shown item (default: when stdin is a terminal).",
    ),
) -> None:
    """Show the highest and lowest k with the judge's reasons, your labelled items and the failures;
    record agree/disagree verdicts."""
    store = store or scores.with_suffix(".verdicts.jsonl")
    try:
        records = read_records(scores)
        tag = rubric_tag(records)
        top, bottom = extremes(records, k, seed)
        kept = read_verdicts(store)
        new = import_verdicts(records, verdicts) if verdicts else []
    except (ValueError, FileNotFoundError) as exc:
        raise _fail(str(exc)) from exc
    shown = latest_verdicts(kept + new)
    cut = (ties(top, records), ties(bottom, records))
    console.print(
        f"{escape(tag)}, {escape(judge_tag(records))}: mean score {Coverage.of(records)}", highlight=False
    )
    for title, part, tie in ((f"highest {len(top)}", top, cut[0]), (f"lowest {len(bottom)}", bottom, cut[1])):
        console.print(_records_table(title, part, shown))
        if tie is not None:
            console.print(f"[yellow]ties:[/yellow] {escape(str(tie))}", highlight=False)
    extra = labelled(records, shown, {r.id for r in top + bottom})
    if extra:
        console.print(_records_table(f"labelled by you, not shown above ({len(extra)})", extra, shown))
    _print_failures(records)
    if not verdicts and (sys.stdin.isatty() if prompt is None else prompt):
        new = _ask_verdicts(top + bottom, records)
    if new:
        added = append_verdicts(store, new)
        same = len(new) - len(added)
        console.print(
            f"kept {len(added)} verdicts in {escape(str(store))} "
            f"({sum(v.agree for v in added)} agree, {sum(not v.agree for v in added)} disagree)"
            + (f"; {same} already kept, not repeated" if same else ""),
            highlight=False,
        )
        shown = latest_verdicts(kept + added)
    if html:
        extra = labelled(records, shown, {r.id for r in top + bottom})
        html.write_text(inspect_page(tag, records, top, bottom, shown, cut, extra), encoding="utf-8")
        console.print(f"wrote {escape(str(html))}", highlight=False)


def _side(name: str, records: list[ScoreRecord], path: Path) -> str:
    return f"{name} = {rubric_tag(records)}, {judge_tag(records)}, {Coverage.of(records).scored}/{len(records)} scored  ({path})"


def _warnings(ra: list[ScoreRecord], rb: list[ScoreRecord], paired: int) -> list[str]:
    out = []
    for name, records in (("A", ra), ("B", rb)):
        c = Coverage.of(records)
        if c.fraction < FEW_SCORED:
            out.append(f"{name} scored only {c.scored} of its {c.total} items; its figures rest on those")
    if paired < FEW_PAIRED:
        out.append(f"only {paired} items were scored by both sides; the correlations say little")
    return out


@app.command()
def compare(
    a: Path = typer.Argument(..., help="Scores JSONL A (a rubric version, or a judge)."),
    b: Path = typer.Argument(..., help="Scores JSONL B."),
    verdicts: Path | None = typer.Option(None, help="A verdicts file kept by `inspect`."),
    threshold: float = typer.Option(0.5, help="Score at or above which an item counts as judged good."),
    html: Path | None = typer.Option(None, help="Also write an HTML page here."),
) -> None:
    """Agreement between two score files (rubric versions or judges), and with a person's verdicts."""
    try:
        ra, rb = read_records(a), read_records(b)
        rubric_tag(ra), rubric_tag(rb)  # each file must hold one rubric version
        if verdicts and not verdicts.exists():
            raise FileNotFoundError(f"verdicts file not found: {verdicts}")
        marks = read_verdicts(verdicts) if verdicts else []
    except (ValueError, FileNotFoundError) as exc:
        raise _fail(str(exc)) from exc
    agree = agreement(ra, rb)
    console.print(_side("A", ra, a) + "\n" + _side("B", rb, b), highlight=False, soft_wrap=True, markup=False)
    warnings = _warnings(ra, rb, agree.n)
    for w in warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False, soft_wrap=True)
    table = Table(title="agreement, items scored by both")
    for col in ("items", "Pearson", "Spearman", "mean |A-B|"):
        table.add_column(col)
    table.add_row(str(agree.n), _fmt(agree.pearson), _fmt(agree.spearman), _fmt(agree.mean_abs_diff))
    console.print(table)
    person = None
    if marks:
        person = (person_agreement(ra, marks, threshold), person_agreement(rb, marks, threshold))
        labels = len(latest_verdicts(marks))
        pt = Table(title=f"agreement with your labels (judged good = score >= {threshold:g})")
        for col in (
            "side",
            "labelled items scored",
            "agree fraction",
            "mean score of 'good'",
            "mean score of 'bad'",
        ):
            pt.add_column(col)
        for name, p in zip("AB", person, strict=True):
            pt.add_row(
                name,
                f"{p.n}/{labels}",
                _fmt(p.agree_fraction),
                _fmt(p.mean_score_good),
                _fmt(p.mean_score_bad),
            )
        console.print(pt)
    if html:
        page = compare_page(
            f"{rubric_tag(ra)}, {judge_tag(ra)}",
            f"{rubric_tag(rb)}, {judge_tag(rb)}",
            agree,
            ra,
            rb,
            person,
            latest_verdicts(marks),
            threshold,
            warnings,
        )
        html.write_text(page, encoding="utf-8")
        console.print(f"wrote {escape(str(html))}", highlight=False)
