"""Pool evaluation episodes of two stages and compare them scenario by scenario.

    python benchmarks/agents_compare.py --env corpus_search \
        --a sft runs/agents/eval/sft_seed*_samples.jsonl \
        --b sft+rl16 runs/agents/eval/rl16_seed*_samples.jsonl --json runs/agents/compare.json

Each file is `benchmarks/agents_eval.py --samples-out` output (one trajectory a line) or a run's
validation samples (`runs/NAME/samples/validation_STEP.jsonl`, one group a line). An episode
succeeds when its grader scored 1.0. Reported per stage: success and mean reward over the pooled
episodes with a Wilson 95% interval, and successes per scenario. For B - A: the difference in
success with a 95% percentile bootstrap interval that resamples whole scenarios (the episodes of
one scenario are correlated; pairing by scenario removes the scenarios' own difficulty), and how
many scenarios B solved more often, less often or equally; and Newcombe's interval of the
difference, which treats every episode as independent (narrower, and optimistic here).

`--earlier COMPARE.json` pools in the episodes of an earlier comparison of the same two adapters
(this script's `--json` output, the same stage names) whose sample files are gone: its
successes per scenario count as episodes (each scenario with the same number of episodes), and its
rewards enter only through each stage's mean reward, which is all that file keeps.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from grooves.jsonl import read_jsonl
from grooves.report.intervals import bootstrap_interval, wilson_interval


def load(files: list[Path]) -> dict[str, list[tuple[float, bool]]]:
    """scenario id -> [(reward, success)] over every episode in `files`."""
    by_scenario: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for path in files:
        for row in read_jsonl(path):
            for traj in row.get("trajectories", [row]):  # a group line holds its trajectories
                if traj.get("error"):  # a failed rollout is not an episode, as in the run's validation
                    continue
                reward = float(traj.get("reward") or 0.0)
                by_scenario[traj["metadata"]["scenario_id"]].append((reward, reward >= 1.0))
    return dict(by_scenario)


def earlier_episodes(stage: dict) -> dict[str, list[tuple[float, bool]]]:
    """A stage of an earlier comparison's JSON as episodes: per scenario its successes and failures,
    each episode carrying the stage's mean reward (the file keeps no per-episode rewards)."""
    counts = stage["successes_per_scenario"]
    per_scenario, extra = divmod(stage["episodes"], len(counts))
    if extra:
        raise ValueError(
            f"--earlier: {stage['episodes']} episodes over {len(counts)} scenarios is not the same number "
            "per scenario, so the successes per scenario do not say how many episodes each had"
        )
    reward = float(stage["reward"])
    return {
        k: [(reward, True)] * wins + [(reward, False)] * (per_scenario - wins) for k, wins in counts.items()
    }


def add_earlier(episodes: dict[str, list[tuple[float, bool]]], stage: dict) -> None:
    """Pool a stage of an earlier comparison's JSON (`earlier_episodes`) into `episodes`, in place."""
    for k, eps in earlier_episodes(stage).items():
        episodes.setdefault(k, []).extend(eps)


def summary(episodes: dict[str, list[tuple[float, bool]]]) -> dict:
    flat = [e for eps in episodes.values() for e in eps]
    wins = sum(s for _, s in flat)
    low, high = wilson_interval(wins, len(flat))
    return {
        "success": wins / len(flat),
        "reward": sum(r for r, _ in flat) / len(flat),
        "episodes": len(flat),
        "ci_low": low,
        "ci_high": high,
        "successes_per_scenario": {k: int(sum(s for _, s in v)) for k, v in sorted(episodes.items())},
    }


def paired_difference(a, b, *, resamples: int = 10_000, seed: int = 0) -> dict:
    """B - A in success, bootstrapped over the scenarios both stages ran."""
    shared = sorted(set(a) & set(b))
    rate = lambda eps: sum(s for _, s in eps) / len(eps)  # noqa: E731
    diffs = np.array([rate(b[k]) - rate(a[k]) for k in shared])  # [S]
    low, high = bootstrap_interval(
        [[d] for d in diffs], resamples=resamples, seed=seed
    )  # a scenario per cluster
    return {
        "difference": float(diffs.mean()),
        "ci_low": float(low),
        "ci_high": float(high),
        "scenarios": len(shared),
        "scenarios_b_better": int((diffs > 0).sum()),
        "scenarios_b_worse": int((diffs < 0).sum()),
        "scenarios_equal": int((diffs == 0).sum()),
    }


def newcombe_difference(a: dict, b: dict) -> tuple[float, float]:
    """95% interval of success_b - success_a treating every episode as independent (Newcombe 1998,
    Statistics in Medicine 17, method 10: from the two Wilson intervals):
    d -/+ sqrt((p - l)^2 + (u - p)^2) with the sides taken from b and a as in the paper."""
    d = b["success"] - a["success"]
    low = d - ((b["success"] - b["ci_low"]) ** 2 + (a["ci_high"] - a["success"]) ** 2) ** 0.5
    high = d + ((b["ci_high"] - b["success"]) ** 2 + (a["success"] - a["ci_low"]) ** 2) ** 0.5
    return low, high


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", required=True)
    parser.add_argument("--a", nargs="+", required=True, metavar=("STAGE", "FILE"))
    parser.add_argument("--b", nargs="+", required=True, metavar=("STAGE", "FILE"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--earlier", type=Path, help="an earlier comparison's --json to pool in")
    args = parser.parse_args()
    (name_a, *files_a), (name_b, *files_b) = args.a, args.b
    a, b = load([Path(f) for f in files_a]), load([Path(f) for f in files_b])
    if args.earlier:
        earlier = json.loads(args.earlier.read_text())
        for name, episodes in ((name_a, a), (name_b, b)):
            if name not in earlier:
                parser.error(f"--earlier {args.earlier} has no stage {name!r}; it has {sorted(earlier)}")
            add_earlier(episodes, earlier[name])
    result = {
        "env": args.env,
        name_a: summary(a) | {"files": files_a},
        name_b: summary(b) | {"files": files_b},
        **({"earlier": str(args.earlier)} if args.earlier else {}),
        f"{name_b} - {name_a}": paired_difference(a, b),
    }
    low, high = newcombe_difference(result[name_a], result[name_b])
    result[f"{name_b} - {name_a}"] |= {"episode_ci_low": low, "episode_ci_high": high}
    for name in (name_a, name_b):
        r = result[name]
        print(
            f"{args.env} {name}: success {r['success']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] "
            f"over {r['episodes']} episodes, reward {r['reward']:.3f}"
        )
    d = result[f"{name_b} - {name_a}"]
    print(
        f"{name_b} - {name_a}: {d['difference']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] (bootstrap over "
        f"{d['scenarios']} scenarios); better on {d['scenarios_b_better']}, worse on {d['scenarios_b_worse']}, "
        f"equal on {d['scenarios_equal']}; treating episodes as independent (Newcombe) "
        f"[{d['episode_ci_low']:+.3f}, {d['episode_ci_high']:+.3f}]"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
