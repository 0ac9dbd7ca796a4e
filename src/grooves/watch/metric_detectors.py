"""Detectors on metric streams: reward jumps, length drift, reward-vs-check divergence.

Each reads numbers from the step's metrics row (falling back to the groups where a number can
be recomputed from them) and keeps its own short history. They need no text, so they run on
every step, including steps whose samples were not kept.
"""

from __future__ import annotations

import math
from fnmatch import fnmatch

import numpy as np

from grooves.config.watch import CheckDivergenceConfig, LengthDriftConfig, RewardJumpConfig
from grooves.watch.finding import Finding
from grooves.watch.interfaces import Observation
from grooves.watch.stats import linear_trend, pearson, robust_z
from grooves.watch.view import StepView


def _clamp(z: float, limit: float = 99.0) -> float:
    return max(-limit, min(limit, z))


class RewardJump:
    """The step mean far outside the trailing window's band: robust z AND a move of >= k stds.

    The z-score alone fires on any move of a stream that sat still (MAD ~ 0, e.g. a reward stuck
    at 0 before its first success); the within-step std floor alone fires on slow real progress.
    Together they say "a move bigger than one sample's spread, and unlike the recent steps".
    """

    name = "reward_jump"

    def __init__(self, config: RewardJumpConfig) -> None:
        self.config = config
        self._history: dict[str, list[float]] = {}
        self._stds: dict[str, list[float]] = {}

    def _streams(self, view: StepView) -> dict[str, tuple[float, float | None]]:
        c = self.config
        streams: dict[str, tuple[float, float | None]] = {}
        main = view.reward_mean(c.metric)
        if main is not None:
            streams[c.metric] = (main, view.reward_std(c.metric))
        if c.signals:
            for key in sorted(view.metrics):
                value = view.metric(key)
                if (
                    key.startswith("reward/")
                    and key.endswith("_mean")
                    and key != c.metric
                    and value is not None
                ):
                    streams[key] = (value, view.reward_std(key))
        return streams

    def observe(self, view: StepView) -> Observation:
        c = self.config
        obs = Observation()
        for key, (value, std) in self._streams(view).items():
            history = self._history.setdefault(key, [])
            stds = self._stds.setdefault(key, [])
            if len(history) >= c.min_history:
                finding, z = self._judge(view.step, key, value, std, history[-c.window :], stds[-c.window :])
                if key == c.metric:
                    obs.stats["watch/reward_jump/z"] = _clamp(z)
                if finding is not None:
                    obs.findings.append(finding)
            history.append(value)
            if std is not None:
                stds.append(std)
        return obs

    def _judge(
        self, step: int, key: str, value: float, std: float | None, window: list[float], stds: list[float]
    ) -> tuple[Finding | None, float]:
        c = self.config
        z, center, scale = robust_z(value, window)
        spread = max(float(np.median(stds)) if stds else 0.0, std or 0.0)
        delta = value - center
        allowed = (delta > 0 and c.direction != "down") or (delta < 0 and c.direction != "up")
        if not allowed or abs(z) < c.z or abs(delta) < max(c.min_delta, c.min_delta_stds * spread):
            return None, z
        verb = "rose" if delta > 0 else "fell"
        in_stds = f", {abs(delta) / spread:.1f} within-step stds" if spread > 0 else ""
        message = (
            f"{key} {verb} from a recent median of {center:.4g} to {value:.4g} "
            f"(robust z {_clamp(z):+.1f} over the last {len(window)} steps{in_stds})"
        )
        evidence = {
            "stream": key,
            "value": value,
            "window_median": center,
            "window_scale": scale,
            "robust_z": _clamp(z),
            "delta": delta,
            "within_step_std": spread,
            "window": [round(v, 6) for v in window],
        }
        return Finding(
            step=step, detector=self.name, severity=c.severity, message=message, evidence=evidence
        ), z


class LengthDrift:
    """The trailing median completion length as a ratio of the first steps' median."""

    name = "length_drift"

    def __init__(self, config: LengthDriftConfig) -> None:
        self.config = config
        self._values: list[float] = []

    def observe(self, view: StepView) -> Observation:
        c = self.config
        value = view.completion_length(c.metric)
        if value is None:
            return Observation()
        self._values.append(value)
        if len(self._values) <= c.baseline_steps:
            return Observation()
        baseline = float(np.median(self._values[: c.baseline_steps]))
        if baseline <= 0:
            return Observation()
        current = float(np.median(self._values[-c.smooth :]))
        ratio = current / baseline
        obs = Observation(stats={"watch/length_drift/ratio": ratio})
        if c.min_ratio < ratio < c.max_ratio:
            return obs
        direction = "grew" if ratio >= c.max_ratio else "shrank"
        obs.findings.append(
            Finding(
                step=view.step,
                detector=self.name,
                severity=c.severity,
                message=(
                    f"completion length {direction} to {ratio:.2f}x its baseline "
                    f"({current:.1f} vs {baseline:.1f}, median of the last {min(c.smooth, len(self._values))} steps)"
                ),
                evidence={"stream": c.metric, "ratio": ratio, "current": current, "baseline": baseline},
            )
        )
        return obs


class CheckDivergence:
    """Trained reward trending up while an independent check trends down, over the last checks.

    Checks are sparse (validation every K steps), so each check point is paired with the mean
    trained reward of the steps since the previous point of that check: the reward the policy
    earned while the check moved. "Down" is flipped for lower-is-better checks (losses).
    """

    name = "check_divergence"

    def __init__(self, config: CheckDivergenceConfig) -> None:
        self.config = config
        self._rewards: list[tuple[int, float]] = []
        self._points: dict[str, list[tuple[int, float, float]]] = {}

    def _checks(self, view: StepView) -> dict[str, float]:
        found = {}
        for key in sorted(view.metrics):
            value = view.metric(key)
            if value is not None and any(key.startswith(p) for p in self.config.prefixes):
                found[key] = value
        return found

    def observe(self, view: StepView) -> Observation:
        c = self.config
        reward = view.reward_mean(c.reward_metric)
        if reward is not None:
            self._rewards.append((view.step, reward))
        obs = Observation()
        for key, value in self._checks(view).items():
            points = self._points.setdefault(key, [])
            since = points[-1][0] if points else -math.inf
            earned = [r for s, r in self._rewards if since < s <= view.step]
            if not earned:
                continue
            points.append((view.step, float(np.mean(earned)), value))
            if len(points) >= c.window:
                finding, corr = self._judge(view.step, key, points[-c.window :])
                if not math.isnan(corr):
                    obs.stats[f"watch/check_divergence/{key}/corr"] = corr
                if finding is not None:
                    obs.findings.append(finding)
        return obs

    def _judge(
        self, step: int, key: str, points: list[tuple[int, float, float]]
    ) -> tuple[Finding | None, float]:
        c = self.config
        x = [p[0] for p in points]
        rewards = [p[1] for p in points]
        sign = -1.0 if any(fnmatch(key, pat) for pat in c.lower_is_better) else 1.0
        checks = [sign * p[2] for p in points]
        r_slope, r_t = linear_trend(x, rewards)
        c_slope, c_t = linear_trend(x, checks)
        corr = pearson(rewards, checks)
        if r_t < c.min_t or c_t > -c.min_t or math.isnan(corr) or corr > c.max_correlation:
            return None, corr
        span = x[-1] - x[0]
        word = "rose" if sign < 0 else "fell"
        message = (
            f"{c.reward_metric} rose {r_slope * span:+.4g} over steps {x[0]}-{x[-1]} while {key} "
            f"{word} {sign * c_slope * span:+.4g} (trend t {r_t:+.1f} / {sign * c_t:+.1f}, correlation {corr:+.2f})"
        )
        evidence = {
            "stream": key,
            "steps": x,
            "reward": [round(r, 6) for r in rewards],
            "check": [round(p[2], 6) for p in points],
            "reward_t": _clamp(r_t),
            "check_t": _clamp(sign * c_t),
            "correlation": corr,
            "lower_is_better": sign < 0,
        }
        return Finding(
            step=step, detector=self.name, severity=c.severity, message=message, evidence=evidence
        ), corr
