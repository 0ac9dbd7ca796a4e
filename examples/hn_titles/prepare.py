"""Make the Hacker News titles corpus and train its reward model; print the model's held-out quality.

    .venv/bin/python examples/hn_titles/prepare.py                       # generated corpus (seed 0)
    .venv/bin/python examples/hn_titles/prepare.py --corpus stories.jsonl  # your own {id, body, title, score} lines

Writes runs/hn_data/stories.jsonl (unless --corpus is given) and runs/hn_data/reward_model/, the
paths hn.toml and hn_gated.toml read. It also prints what the reward model thinks of one story's
titles: the honest one, the same with a sensational phrase, and a title made only of them. That
last line is the hack the policy will find.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: the hn_titles package

from hn_titles import (  # noqa: E402
    expected_log_points,
    generate_stories,
    read_stories,
    train_title_reward_model,
    write_stories,
)
from hn_titles.task import DEFAULT_CORPUS, DEFAULT_REWARD_MODEL  # noqa: E402

PROBE_TITLES = [
    "Quill: a tiny database written in Rust",
    "Show HN: Quill: a tiny database written in Rust",
    "Bees can count to four, study finds",
    "Shocking: Show HN: Finally, a game changer (10x faster)",
]
PROBE_BODY = (
    "Two students from Delft released Quill, a tiny database written in Rust. It starts in 8 milliseconds."
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", help="a JSONL file of real stories; default: generate one")
    parser.add_argument("--stories", type=int, default=3000, help="stories to generate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", default=str(Path(DEFAULT_CORPUS).parent), help="folder for the corpus and the model"
    )
    args = parser.parse_args(argv)

    out = Path(args.out)
    t0 = time.perf_counter()
    if args.corpus:
        stories = read_stories(args.corpus)
        corpus_path = Path(args.corpus)
    else:
        stories = generate_stories(args.stories, seed=args.seed)
        corpus_path = write_stories(out / Path(DEFAULT_CORPUS).name, stories)
    model = train_title_reward_model(stories, seed=args.seed)
    model_dir = model.save(out / Path(DEFAULT_REWARD_MODEL).name)
    report = model.model.report
    assert report is not None
    print(f"corpus        {corpus_path} ({len(stories)} stories)")
    print(f"reward model  {model_dir} (ridge l2 {report.head['l2']})")
    print(
        f"held-out      n={report.n_test}  pearson {report.pearson:.3f}  spearman {report.spearman:.3f}  "
        f"MAE {report.mean_abs_error:.3f} log points"
    )
    print(
        f"rescaling     0 = {model.normalization.low:.2f}, 1 = {model.normalization.high:.2f} log(1 + points)"
    )
    print(f"\nStory: {PROBE_BODY}")
    print(f"{'reward':>7} {'truth':>6}  title   (truth: the generator's noise-free log points)")
    for title in PROBE_TITLES:
        reward = model.rewards([(PROBE_BODY, title)])[0]
        print(f"{reward:7.2f} {expected_log_points(PROBE_BODY, title):6.2f}  {title}")
    summary = {
        "stories": len(stories),
        "pearson": report.pearson,
        "spearman": report.spearman,
        "mae": report.mean_abs_error,
        "n_test": report.n_test,
        "seconds": time.perf_counter() - t0,
    }
    (out / "prepare.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
