"""Built-in task `capitals`: name a country's capital in one short sentence.

Chosen by measuring what SmolLM2-135M can already sometimes do (RL amplifies behaviour, it does
not create it): asked for a capital, the base model names the right city about 60% of the time,
but often wraps it in rambling, repeats itself or drifts to other facts. Success means the right
capital in a short answer (at most `max_words` words, one line). The reward is code-checked:

    reward = correct * (1 if words <= max_words else max_words / words)

so a correct but long answer earns partial credit and the group-relative advantage prefers the
concise ones. Train and validation use disjoint countries, so the validation success rate
measures the learned behaviour (answer concisely and correctly), not memorized pairs.
"""

from __future__ import annotations

import random
import re
from typing import Any

from grooves.core.trajectory import Trajectory
from grooves.rollouts.handle import ModelHandle

CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Italy": "Rome",
    "Germany": "Berlin",
    "Spain": "Madrid",
    "Egypt": "Cairo",
    "Canada": "Ottawa",
    "Russia": "Moscow",
    "China": "Beijing",
    "Greece": "Athens",
    "Peru": "Lima",
    "Kenya": "Nairobi",
    "Norway": "Oslo",
    "Poland": "Warsaw",
    "Portugal": "Lisbon",
    "Austria": "Vienna",
    "Sweden": "Stockholm",
    "Ireland": "Dublin",
    "Cuba": "Havana",
    "Chile": "Santiago",
    "Thailand": "Bangkok",
    "Iran": "Tehran",
    "Hungary": "Budapest",
    "Finland": "Helsinki",
    "Denmark": "Copenhagen",
    "Belgium": "Brussels",
    "Argentina": "Buenos Aires",
    "Mexico": "Mexico City",
    "South Korea": "Seoul",
    "Vietnam": "Hanoi",
    "Indonesia": "Jakarta",
    "Philippines": "Manila",
    "Turkey": "Ankara",
    "Iraq": "Baghdad",
    "Syria": "Damascus",
    "Lebanon": "Beirut",
    "Jordan": "Amman",
    "Saudi Arabia": "Riyadh",
    "Afghanistan": "Kabul",
    "Pakistan": "Islamabad",
    "India": "New Delhi",
    "Nepal": "Kathmandu",
    "Bangladesh": "Dhaka",
    "Sri Lanka": "Colombo",
    "Malaysia": "Kuala Lumpur",
    "Singapore": "Singapore",
    "Australia": "Canberra",
    "New Zealand": "Wellington",
    "Colombia": "Bogota",
    "Venezuela": "Caracas",
    "Ecuador": "Quito",
    "Bolivia": "La Paz",
    "Uruguay": "Montevideo",
    "Paraguay": "Asuncion",
    "Brazil": "Brasilia",
    "Morocco": "Rabat",
    "Algeria": "Algiers",
    "Tunisia": "Tunis",
    "Libya": "Tripoli",
    "Sudan": "Khartoum",
    "Ethiopia": "Addis Ababa",
    "Nigeria": "Abuja",
    "Ghana": "Accra",
    "Senegal": "Dakar",
    "Uganda": "Kampala",
    "Tanzania": "Dodoma",
    "Zimbabwe": "Harare",
    "Zambia": "Lusaka",
    "Angola": "Luanda",
    "Ukraine": "Kyiv",
    "Romania": "Bucharest",
    "Bulgaria": "Sofia",
    "Serbia": "Belgrade",
    "Croatia": "Zagreb",
    "Czech Republic": "Prague",
    "Slovakia": "Bratislava",
    "Switzerland": "Bern",
    "Netherlands": "Amsterdam",
    "Iceland": "Reykjavik",
    "Estonia": "Tallinn",
    "Latvia": "Riga",
    "Lithuania": "Vilnius",
    "Belarus": "Minsk",
    "United Kingdom": "London",
    "Scotland": "Edinburgh",
    "Wales": "Cardiff",
    "Qatar": "Doha",
    "Israel": "Jerusalem",
    "Mongolia": "Ulaanbaatar",
    "Jamaica": "Kingston",
    "Panama": "Panama City",
}

SYSTEM_PROMPT = "Be brief."


def _words(text: str) -> list[str]:
    return re.findall(r"[\w']+", text)


def _normalize(text: str) -> str:
    return re.sub(r"[^a-z ]", "", text.lower().replace("-", " "))


def score_answer(answer: str, capital: str, max_words: int) -> tuple[float, bool, int]:
    """(reward, success, word count) of one answer; see the module docstring for the formula."""
    text = answer.strip()
    n = len(_words(text))
    correct = _normalize(capital) in _normalize(text)
    one_line = "\n" not in text
    if not correct or n == 0:
        return 0.0, False, n
    concise = n <= max_words and one_line
    reward = 1.0 if concise else max_words / max(n, max_words + 1) * (1.0 if one_line else 0.5)
    return reward, concise, n


class CapitalsTask:
    """Scenarios are countries; a rollout asks once and scores the answer."""

    name = "capitals"

    def __init__(self, validation_fraction: float = 0.3, max_words: int = 6, seed: int = 1234):
        self.max_words = max_words
        countries = sorted(CAPITALS)
        random.Random(seed).shuffle(countries)
        n_val = max(1, int(len(countries) * validation_fraction))
        self._splits = {"validation": countries[:n_val], "train": countries[n_val:]}

    def scenarios(self, split: str) -> list[dict[str, Any]]:
        if split not in self._splits:
            raise ValueError(f"split {split!r} is unknown; use 'train' or 'validation'")
        return [{"country": c, "capital": CAPITALS[c]} for c in self._splits[split]]

    async def rollout(self, model: ModelHandle, scenario: dict[str, Any]) -> Trajectory:
        traj = Trajectory(
            messages=[
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": f"What is the capital of {scenario['country']}?"},
            ],
            metadata={"country": scenario["country"]},
        )
        traj.add_choice(await model.complete(traj.messages))
        reward, success, n_words = score_answer(traj.completion, scenario["capital"], self.max_words)
        traj.reward = reward
        traj.rewards["answer"] = reward
        traj.metrics.update(success=float(success), words=float(n_words))
        return traj
