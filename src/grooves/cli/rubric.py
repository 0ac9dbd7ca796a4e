"""`grooves rubric interview`: a judge model asks what good looks like, drafts a rubric, hands it to calibration.

    grooves rubric interview capitals --out capitals.toml               # a task: three of its train scenarios
    grooves rubric interview --run runs/capitals --out capitals.toml    # a run: its task, [judge], samples
    grooves rubric interview "Summarize a support ticket in one line" --out tickets.toml
    grooves rubric interview capitals --answers answers.txt --out capitals.toml   # no prompts

The judge endpoint is the one `grooves judge` and a run's `[judge]` use: --base-url / --model,
else the run file's `[judge]`, else GROOVES_JUDGE_BASE_URL / GROOVES_JUDGE_MODEL. The model asks
up to --questions questions, one at a time; an empty answer or "done" ends them early, Ctrl-C
quits. Then it drafts the rubric (`judge.interview`), which is shown and written only when the
person accepts it, possibly after editing it in $EDITOR. With --answers the answers come from a
file, one per line, nothing is asked, and a valid draft is written.

Nothing is ever overwritten without --overwrite, and nothing is written that does not load:
no endpoint, an endpoint that is down, a model that never drafts a valid rubric (one repair
allowed), or an existing file each end in one line saying what to do, exit code 1. Answers
typed before the judge failed are kept in a file named on that line, for --answers.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.prompt import Prompt

from grooves.cli.rubric_next import Step, run_steps, sample_steps, train_steps
from grooves.cli.rubric_source import Source, SourceError, resolve
from grooves.judge.endpoint import JudgeClient, JudgeConfig
from grooves.judge.errors import JudgeError
from grooves.judge.interview import Draft, Interview, Turn
from grooves.judge.rubric import Rubric, RubricError, load_rubric, parse_rubric

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Rubrics: draft one with a judge model.")
console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

STOP_WORDS = ("", "done")
"""An answer that ends the questions early."""


class Stop(Exception):
    """The interview ends with nothing written; the message is the one line to print."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _say(text: str) -> None:
    console.print(escape(text))


class FileAnswers:
    """Answers from a file, one per non-empty line; a line "done" or the end of the file ends the questions."""

    def __init__(self, path: Path) -> None:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise Stop(
                f"--answers {path}: cannot read it ({exc}); give a text file, one answer per line"
            ) from None
        self.left = [line.strip() for line in lines if line.strip()]
        if not self.left:
            raise Stop(f"--answers {path}: the file holds no answers; write one answer per line")

    def more(self) -> bool:
        return bool(self.left) and self.left[0].lower() != "done"

    def __call__(self, number: int) -> str | None:
        if not self.more():
            return None
        text = self.left.pop(0)
        console.print(f"[bold]A{number}>[/bold] {escape(text)}")
        return text


class TerminalAnswers:
    """Answers typed at the prompt; an empty answer, "done" or end of input ends the questions."""

    def more(self) -> bool:
        return True

    def __call__(self, number: int) -> str | None:
        try:
            text = Prompt.ask(f"[bold]A{number}[/bold]", console=console, default="", show_default=False)
        except EOFError:
            return None
        return None if text.strip().lower() in STOP_WORDS else text.strip()


def _converse(
    judge: JudgeConfig,
    source: Source,
    questions: int,
    name: str,
    answer: FileAnswers | TerminalAnswers,
    check: bool,
    turns: list[Turn],
) -> Draft:
    """Ask, collect answers into `turns` (kept by the caller if the judge fails), then draft.

    Each request runs on one event loop kept between them (`asyncio.Runner`); the answers are read
    while no loop runs, so Ctrl-C at a prompt is a plain KeyboardInterrupt, and during a request
    it cancels the request first.
    """
    with asyncio.Runner() as loop:
        client = JudgeClient(judge)
        try:
            if check:
                loop.run(client.check())
            interview = Interview(client, source.context(), questions=questions)
            for number in range(1, questions + 1):
                if not answer.more():  # a file's answers are used up: no question nobody will answer
                    break
                question = loop.run(interview.question(turns))
                console.print(f"\n[bold]Q{number}[/bold] {escape(question)}")
                reply = answer(number)
                if reply is None:
                    break
                turns.append(Turn(question, reply))
            if not turns:
                raise Stop("no answers, so no rubric: answer at least one question; nothing written")
            _say(f"\ndrafting the rubric from {len(turns)} answers ...")

            def invalid(reply: str, problem: str) -> None:
                console.rule("the judge's draft (cannot be used)")
                _say(reply)
                console.print(f"[yellow]problem:[/yellow] {escape(problem)}")

            return loop.run(interview.draft(turns, name, on_invalid=invalid))
        finally:
            loop.run(client.aclose())


def _keep_answers(out: Path, turns: list[Turn]) -> Path | None:
    """Write the typed answers beside --out (a new file, never over one); None when there is none to keep."""
    if not turns:
        return None
    for k in range(1, 100):
        path = out.with_name(f"{out.stem}.answers{'' if k == 1 else f'-{k}'}.txt")
        try:
            with path.open("x", encoding="utf-8") as f:
                f.write("".join(t.answer + "\n" for t in turns))
            return path
        except FileExistsError:
            continue
    return None


def _accept(rubric: Rubric, out: Path) -> str | None:
    """Ask y (write) / e (edit in $EDITOR) / n (quit); the accepted TOML text, None when declined."""
    text, valid = rubric.to_toml(), True
    while True:
        choices = ["y", "e", "n"] if valid else ["e", "n"]
        what = "y: write it, " if valid else ""
        try:
            choice = Prompt.ask(
                f"Write it to {escape(str(out))}? ({what}e: edit it in $EDITOR, n: quit, nothing written)",
                choices=choices,
                default=choices[0],
                console=console,
            )
        except EOFError:
            return None
        if choice == "n":
            return None
        if choice == "y":
            return text
        try:
            edited = click.edit(text, extension=".toml", require_save=False)
        except click.ClickException as exc:
            console.print(f"[red]editor:[/red] {escape(exc.format_message())}; set $EDITOR to your editor")
            continue
        text = edited if edited is not None else text
        try:
            shown = parse_rubric(text, "the edited rubric")
        except RubricError as exc:
            console.print(f"[red]cannot be written:[/red] {escape(str(exc))}")
            valid = False
            continue
        valid = True
        console.rule(f"edited rubric {escape(shown.tag)}")
        _say(text)


def _write(out: Path, text: str, overwrite: bool) -> Rubric:
    """Write the rubric (a new file unless --overwrite, atomically either way) and load it back."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        if overwrite:
            os.replace(tmp, out)
        else:
            _create(tmp, out, text)
    except FileExistsError:
        raise Stop(
            f"{out} appeared during the interview; pass --overwrite to replace it, or --out another file"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    return load_rubric(out)


def _create(tmp: Path, out: Path, text: str) -> None:
    """Make `out` hold `text` only if it does not exist, even if it appeared during the interview."""
    try:
        os.link(tmp, out)  # atomic: the whole file or none
    except FileExistsError:
        raise
    except OSError:  # a file system without hard links
        with out.open("x", encoding="utf-8") as f:
            f.write(text)


def _judge_config(source: Source, base_url, model, api_key, timeout, max_tokens) -> JudgeConfig:
    settings = {
        "base_url": base_url or source.judge.get("base_url"),
        "model": model or source.judge.get("model"),
        "api_key": api_key,
        "timeout_s": timeout,
        "max_tokens": max_tokens,
        "cache_path": None,  # an interview is a conversation, not a verdict to reuse
    }
    return JudgeConfig.model_validate(settings).resolved()


def _next(source: Source, rubric: Rubric, out: Path, judge: JudgeConfig, score_sample, interactive) -> None:
    sample = sample_steps(source, out, judge)
    steps: list[Step] = sample + train_steps(source, rubric, out, judge)
    console.rule("next")
    if not sample:
        _say(
            "No batch to score yet: give --batch FILE ({id, input, output} JSONL, or a run's samples), "
            "or --run RUN, and run `grooves judge score FILE --rubric " + str(out) + "`."
        )
    for k, step in enumerate(steps, start=1):
        _say(f"{k}. {step.what}:\n   {step.line()}")
    if not sample:
        return
    if score_sample is None and interactive:
        score_sample = (
            Prompt.ask(f"Run steps 1-{len(sample)} now?", choices=["y", "n"], default="y", console=console)
            == "y"
        )
    if score_sample:
        run_steps(sample, judge, prompt=interactive, echo=_say)


@app.command()
def interview(
    task: str | None = typer.Argument(
        None,
        help="The task: a run file (*.toml), a task name (capitals, env:support_desk, package.module:Task), "
        "or a description in quotes.",
    ),
    out: Path = typer.Option(
        Path("rubric.toml"), "--out", "-o", help="Rubric file to write (never over one)."
    ),
    run: Path | None = typer.Option(
        None, "--run", help="A run folder: its task and judge settings, and its latest samples as the batch."
    ),
    batch: Path | None = typer.Option(
        None, "--batch", help="Outputs to score first: {id, input, output} JSONL or a run's samples."
    ),
    answers: Path | None = typer.Option(
        None, "--answers", help="Answers from this file, one per line: no prompts, a valid draft is written."
    ),
    questions: int = typer.Option(6, "--questions", "-n", min=1, max=20, help="Most questions asked."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out if it exists."),
    score_sample: bool | None = typer.Option(
        None,
        "--score-sample/--no-score-sample",
        help="Then score the batch and show its extremes (default: ask; with --answers, only print how).",
    ),
    base_url: str | None = typer.Option(
        None, help="Judge endpoint, ending in /v1 (env GROOVES_JUDGE_BASE_URL)."
    ),
    model: str | None = typer.Option(None, help="Judge model (env GROOVES_JUDGE_MODEL)."),
    api_key: str | None = typer.Option(None, help="API key (env GROOVES_JUDGE_API_KEY)."),
    timeout: float = typer.Option(120.0, min=0.001, help="Per-request timeout in seconds."),
    max_tokens: int = typer.Option(1024, min=64, help="Longest draft; a question gets at most 200."),
    check: bool = typer.Option(
        True, "--check/--no-check", help="Ask the endpoint's /models for the model before the first question."
    ),
) -> None:
    """Draft a rubric in a short interview with a judge model, then score a batch with it."""
    interactive = answers is None
    turns: list[Turn] = []
    try:
        if out.exists() and not overwrite:
            raise Stop(f"{out} exists: pass --overwrite to replace it, or --out another file; nothing asked")
        if out.suffix.lower() != ".toml":
            raise Stop(f"--out {out}: rubric files are TOML; name it *.toml")
        answer = FileAnswers(answers) if answers is not None else TerminalAnswers()
        source = resolve(task, run, batch)
        judge = _judge_config(source, base_url, model, api_key, timeout, max_tokens)
        console.print(
            f"Interview with [bold]{escape(str(judge.model))}[/bold] at {escape(str(judge.base_url))}: up to "
            f"{questions} questions about {escape(source.description.splitlines()[0])}"
        )
        if interactive:
            _say('An empty answer or "done" ends the questions; Ctrl-C quits, nothing written.')
        name = "".join(c if c.isalnum() or c in "_-" else "_" for c in out.stem) or "rubric"
        draft = _converse(judge, source, questions, name, answer, check, turns)
        if isinstance(answer, FileAnswers) and answer.more():
            _say(
                f"({len(answer.left)} more answers in {answers} than --questions {questions} asks for: not used)"
            )
        console.rule(
            f"drafted rubric {escape(draft.rubric.tag)}" + (" (after one repair)" if draft.problems else "")
        )
        _say(draft.rubric.to_toml())
        text = _accept(draft.rubric, out) if interactive else draft.rubric.to_toml()
        if text is None:
            raise Stop("not written: nothing changed", code=0)
        rubric = _write(out, text, overwrite)
    except (SourceError, ValueError) as exc:
        _fail(str(exc), 1)
    except JudgeError as exc:
        kept = _keep_answers(out, turns) if interactive else None
        again = f"; your answers are in {kept}: rerun with --answers {kept}" if kept else ""
        _fail(f"{exc}{again}; nothing written", 1)
    except Stop as exc:
        _fail(str(exc), exc.code)
    except KeyboardInterrupt:
        _fail("stopped: nothing written", 130)
    console.print(
        f"wrote {escape(str(out))} ({escape(rubric.tag)}): it loads with `--rubric {escape(str(out))}`"
    )
    _next(source, rubric, out, judge, score_sample, interactive)


def _fail(message: str, code: int) -> None:
    if code == 0:
        console.print(escape(message))
    else:
        err.print(f"[red]error:[/red] {escape(message)}")
    sys.stdout.flush()
    raise typer.Exit(code)
