"""Write a run's report.html: the one function behind `grooves report` and the end of a run."""

from __future__ import annotations

from pathlib import Path


def write_report(
    run_dir: str | Path,
    out: str | Path | None = None,
    *,
    rewatch: bool = False,
    sample_steps: int = 6,
    picks: tuple[int, int, int] = (3, 3, 4),
) -> tuple[Path, str]:
    """Render the report; returns (path, a one-line summary). `picks` = (best, worst, random)."""
    from grooves.report.html import report_page
    from grooves.report.rundir import load_run
    from grooves.report.rundir import rewatch as run_watch

    run_dir = Path(run_dir)
    run = load_run(run_dir)
    findings, watch_rows = run_watch(run) if rewatch else (run.findings, run.watch_stats)
    path = Path(out) if out is not None else run_dir / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = report_page(
        run, findings, watch_rows, sample_steps=sample_steps, picks=picks, links_from=path.parent
    )
    path.write_text(text, encoding="utf-8")
    images = text.count("data:image/png;base64,")
    return path, f"wrote {path}: {len(run.metrics)} steps, {len(findings)} findings, {images} figures"
