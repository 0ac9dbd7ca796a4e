"""Detectors on a step's texts: collapse across inputs, and outputs that ignore their input.

Both compare against a baseline taken from the run's own first observed steps, because what
is normal differs by task: tool calls share most of their n-grams from step 0, titles do not.
They need the step's groups, so they run on the steps whose samples the trainer passes in.
"""

from __future__ import annotations

import numpy as np

from grooves.config.watch import CollapseConfig, InputIndependenceConfig
from grooves.core.trajectory import Trajectory
from grooves.watch.finding import Finding
from grooves.watch.interfaces import EmbedFn, Observation, RescoreFn
from grooves.watch.text import cross_pairs, duplicate_rate, grounding, mean_cosine, mean_ngram_jaccard
from grooves.watch.view import StepView


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


class Collapse:
    """Exact duplicates, n-gram overlap and (optionally) embedding cosine across different inputs."""

    name = "collapse"

    def __init__(self, config: CollapseConfig, embed: EmbedFn | None = None, seed: int = 0) -> None:
        self.config = config
        self.embed = embed
        self.seed = seed
        self._early: dict[str, list[float]] = {}
        self._thresholds = {
            "duplicate_rate": config.duplicate_rate,
            "ngram_jaccard": config.ngram_jaccard,
            "embedding_cosine": config.embedding_cosine,
        }

    def observe(self, view: StepView) -> Observation:
        c = self.config
        if len(view.outputs) < 2:
            return Observation()
        rng = np.random.default_rng([self.seed, view.step])
        pairs = cross_pairs([len(o) for o in view.outputs], c.max_pairs, rng)
        dup, top, top_inputs = duplicate_rate(view.outputs)
        measures = {"duplicate_rate": dup, "ngram_jaccard": mean_ngram_jaccard(view.outputs, c.ngram, pairs)}
        if self.embed is not None:
            measures["embedding_cosine"] = mean_cosine(self._embeddings(self.embed, view.outputs), pairs)
        obs = Observation(stats={f"watch/collapse/{k}": v for k, v in measures.items()})
        fired, baselines = {}, {}
        for key, value in measures.items():
            early = self._early.setdefault(key, [])
            if len(early) < c.baseline_steps:
                early.append(value)
                continue
            baselines[key] = base = float(np.median(early))
            if value >= self._thresholds[key] and value - base >= c.min_rise:
                fired[key] = value
        if fired:
            obs.findings.append(self._finding(view, measures, baselines, fired, top, top_inputs))
        return obs

    def _embeddings(self, embed: EmbedFn, outputs: list[list[str]]) -> list[np.ndarray]:
        flat = [o for group in outputs for o in group]
        vectors = np.asarray(embed(flat), dtype=float)
        if vectors.ndim != 2 or vectors.shape[0] != len(flat):
            raise ValueError(
                f"the watch's embed function returned shape {vectors.shape} for {len(flat)} texts; "
                "it must return one row per text, [n, d]"
            )
        bounds = np.cumsum([0] + [len(g) for g in outputs])
        return [vectors[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def _finding(self, view, measures, baselines, fired, top, top_inputs) -> Finding:
        parts = []
        if top_inputs > 1:
            parts.append(f'"{_short(top, 80)}" is an output for {top_inputs} of {len(view.outputs)} inputs')
        labels = {
            "duplicate_rate": "outputs shared verbatim with another input",
            "ngram_jaccard": f"mean word {self.config.ngram}-gram Jaccard across inputs",
            "embedding_cosine": "mean embedding cosine across inputs",
        }
        for key, value in fired.items():
            parts.append(f"{labels[key]} {value:.2f} (baseline {baselines[key]:.2f})")
        evidence = {
            "stream": "outputs",
            **{k: round(v, 6) for k, v in measures.items()},
            **{f"baseline_{k}": round(v, 6) for k, v in baselines.items()},
            "fired": sorted(fired),
            "top_output": _short(top),
            "top_output_inputs": top_inputs,
            "inputs": len(view.outputs),
        }
        return Finding(
            step=view.step,
            detector=self.name,
            severity=self.config.severity,
            message="; ".join(parts),
            evidence=evidence,
        )


class InputIndependence:
    """Outputs matched back to their own input (lexical), and optionally rescored on shuffled inputs.

    Lexical: an output is "retrieved" when it overlaps its own input more than any other input;
    the accuracy falling far below its baseline means outputs stopped being about their input.
    Rescoring: the reward of an output with its own scenario vs with another group's; when
    shuffling barely changes the score, the reward does not depend on the input and a policy can
    earn it with one answer for everything.
    """

    name = "input_independence"

    def __init__(
        self, config: InputIndependenceConfig, rescore: RescoreFn | None = None, seed: int = 0
    ) -> None:
        self.config = config
        self.rescore = rescore
        self.seed = seed
        self._accuracy: list[float] = []
        self._blind_said = False
        self._observed = 0
        self._scale: float | None = None

    def observe(self, view: StepView) -> Observation:
        obs = Observation()
        if len(view.outputs) >= self.config.min_groups:
            self._lexical(view, obs)
        if self.rescore is not None and len(view.groups) >= 2:
            if self._observed % self.config.rescore_every == 0:
                self._rescored(self.rescore, view, obs)
            self._observed += 1
        return obs

    def _lexical(self, view: StepView, obs: Observation) -> None:
        c = self.config
        g = grounding(view.outputs, view.inputs)
        obs.stats.update({f"watch/input_independence/{k}": g[k] for k in ("accuracy", "own", "shuffled")})
        self._accuracy.append(g["accuracy"])
        if len(self._accuracy) <= c.baseline_steps:
            return
        baseline = float(np.median(self._accuracy[: c.baseline_steps]))
        if baseline < c.min_baseline_accuracy:
            if not self._blind_said:
                self._blind_said = True
                obs.findings.append(self._blind(view.step, baseline, g["chance"]))
            return
        current = float(np.median(self._accuracy[-c.smooth :]))
        if current > baseline * (1 - c.max_relative_drop):
            return
        message = (
            f"only {current:.0%} of outputs can be matched back to their own input by the words they "
            f"share (baseline {baseline:.0%}, chance {g['chance']:.0%}); word overlap with own input "
            f"{g['own']:.2f} vs a random other input {g['shuffled']:.2f}"
        )
        evidence = {"stream": "lexical", "accuracy": current, "baseline_accuracy": baseline, **g}
        obs.findings.append(
            Finding(
                step=view.step, detector=self.name, severity=c.severity, message=message, evidence=evidence
            )
        )

    def _blind(self, step: int, baseline: float, chance: float) -> Finding:
        return Finding(
            step=step,
            detector=self.name,
            severity="info",
            message=(
                f"outputs rarely share words with their own input (retrieval accuracy {baseline:.0%} at the "
                f"start, chance {chance:.0%}), so the lexical input-independence test is off for this run"
            ),
            evidence={"stream": "lexical", "baseline_accuracy": baseline, "chance": chance},
        )

    def _rescored(self, rescore: RescoreFn, view: StepView, obs: Observation) -> None:
        c = self.config
        rng = np.random.default_rng([self.seed, view.step, 1])
        own, shuffled, errors = [], [], []
        for g, traj in self._sample(view, rng):
            h = int(rng.choice([k for k in range(len(view.groups)) if k != g]))
            try:
                a = float(rescore(traj.model_copy(deep=True), dict(view.groups[g].scenario)))
                b = float(rescore(traj.model_copy(deep=True), dict(view.groups[h].scenario)))
            except (
                Exception
            ) as exc:  # the user's reward failing is data for the watch, not a crash of the run
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            own.append(a)
            shuffled.append(b)
        if len(own) < 2:
            if errors:
                obs.findings.append(self._rescore_failed(view.step, errors))
            return
        if float(np.std(own + shuffled)) == 0:
            return  # every score equal (e.g. a gated reward nobody earns yet): nothing to compare
        if self._scale is None:
            self._scale = float(np.std(own)) or float(np.std(own + shuffled))
        effect = float(np.mean(np.subtract(own, shuffled))) / self._scale
        obs.stats["watch/input_independence/rescore_effect"] = effect
        if effect >= c.min_effect:
            return
        message = (
            f"scoring outputs against another input's scenario barely changes the reward: mean "
            f"{np.mean(own):.4g} with their own input vs {np.mean(shuffled):.4g} shuffled "
            f"({effect:+.2f} reward spreads, {len(own)} outputs)"
        )
        evidence = {
            "stream": "rescore",
            "effect": effect,
            "own_mean": float(np.mean(own)),
            "shuffled_mean": float(np.mean(shuffled)),
            "scale": self._scale,
            "samples": len(own),
            "errors": len(errors),
        }
        obs.findings.append(
            Finding(
                step=view.step, detector=self.name, severity=c.severity, message=message, evidence=evidence
            )
        )

    def _sample(self, view: StepView, rng: np.random.Generator) -> list[tuple[int, Trajectory]]:
        """Up to `rescore_samples` trajectories, round-robin over groups in random order."""
        order = [list(rng.permutation(len(ts))) for ts in view.trajectories]
        groups = list(rng.permutation(len(view.trajectories)))
        picked: list[tuple[int, Trajectory]] = []
        while len(picked) < self.config.rescore_samples and any(order):
            for g in groups:
                if order[g] and len(picked) < self.config.rescore_samples:
                    picked.append((int(g), view.trajectories[g][order[g].pop()]))
        return picked

    def _rescore_failed(self, step: int, errors: list[str]) -> Finding:
        return Finding(
            step=step,
            detector=self.name,
            severity="info",
            message=f"rescoring on shuffled inputs failed for {len(errors)} outputs; first error: {errors[0]}",
            evidence={"stream": "rescore", "errors": len(errors), "first_error": errors[0][:300]},
        )
