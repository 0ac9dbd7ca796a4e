"""Demonstrations for the strict-format task: for each training category, a few answers in the
exact format (`a, b, c`, three different members), as chats for an `[sft]` stage.

    PYTHONPATH=examples python examples/strict_list/demos.py --out runs/strict_list/demos.jsonl

Validation categories never appear: the held-out success after SFT and RL measures the format on
categories the model was not shown.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from strict_list.task import CATEGORIES, SYSTEM_PROMPT, StrictListTask, score_answer


def demonstrations(per_category: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    chats = []
    for scenario in StrictListTask().scenarios("train"):
        category = scenario["category"]
        for _ in range(per_category):
            answer = ", ".join(rng.sample(sorted(CATEGORIES[category]), 3))
            assert score_answer(answer, category) == (1.0, "ok"), answer
            chats.append(
                {
                    "messages": [
                        {"role": "system", "content": SYSTEM_PROMPT},
                        {"role": "user", "content": f"Name three {category}."},
                        {"role": "assistant", "content": answer},
                    ]
                }
            )
    return chats


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--per-category", type=int, default=4)
    args = parser.parse_args()
    chats = demonstrations(args.per_category)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(c) + "\n" for c in chats))
    print(
        f"{len(chats)} demonstrations from {len(chats) // args.per_category} training categories -> {args.out}"
    )


if __name__ == "__main__":
    main()
