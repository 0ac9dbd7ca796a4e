"""A strict-format task: "Name three fruits." must be answered as exactly `apple, pear, plum`.

    PYTHONPATH=examples grooves train examples/strict_list/run.toml

The reward is all or nothing, as in many real formats a downstream parser reads: 1.0 when the
answer is three different members of the category, lowercase, separated by ", ", and nothing
else (no period, no preamble, no numbering); else 0.0. SmolLM2-135M-Instruct rarely answers so
on its own (it writes "These are three fruits that I ..."): in 9 RL steps of run.toml without its
`[sft]` stage, 1 of 864 answers passed. So most groups start with equal rewards, which is what this
task is for: checking that the run file's defaults (learning rate, refills of tied groups) learn
from a sparse, strict reward, not only from `capitals`' graded one.
Train and validation use disjoint categories.
"""

from __future__ import annotations

import re
from typing import Any

from grooves import ModelHandle, Trajectory

CATEGORIES: dict[str, set[str]] = {
    "fruits": {
        "apple",
        "banana",
        "orange",
        "pear",
        "plum",
        "grape",
        "mango",
        "cherry",
        "peach",
        "lemon",
        "lime",
        "kiwi",
        "melon",
        "watermelon",
        "strawberry",
        "pineapple",
        "apricot",
        "fig",
        "papaya",
        "blueberry",
    },
    "colors": {
        "red",
        "blue",
        "green",
        "yellow",
        "orange",
        "purple",
        "pink",
        "black",
        "white",
        "brown",
        "gray",
        "grey",
        "violet",
        "cyan",
        "magenta",
        "indigo",
    },
    "animals": {
        "dog",
        "cat",
        "horse",
        "cow",
        "lion",
        "tiger",
        "elephant",
        "bear",
        "wolf",
        "fox",
        "rabbit",
        "deer",
        "monkey",
        "giraffe",
        "zebra",
        "pig",
        "sheep",
        "goat",
        "mouse",
        "snake",
    },
    "vegetables": {
        "carrot",
        "potato",
        "tomato",
        "onion",
        "broccoli",
        "spinach",
        "lettuce",
        "cabbage",
        "pea",
        "peas",
        "corn",
        "cucumber",
        "pepper",
        "garlic",
        "celery",
        "kale",
        "zucchini",
        "beet",
    },
    "planets": {"mercury", "venus", "earth", "mars", "jupiter", "saturn", "uranus", "neptune"},
    "metals": {
        "iron",
        "gold",
        "silver",
        "copper",
        "aluminum",
        "aluminium",
        "zinc",
        "lead",
        "tin",
        "nickel",
        "platinum",
        "titanium",
    },
    "birds": {
        "eagle",
        "sparrow",
        "robin",
        "crow",
        "owl",
        "parrot",
        "pigeon",
        "duck",
        "swan",
        "hawk",
        "penguin",
        "chicken",
        "flamingo",
        "peacock",
    },
    "sports": {
        "soccer",
        "football",
        "tennis",
        "basketball",
        "baseball",
        "golf",
        "hockey",
        "rugby",
        "cricket",
        "swimming",
        "volleyball",
        "boxing",
        "cycling",
        "skiing",
    },
    "musical instruments": {
        "piano",
        "guitar",
        "violin",
        "drums",
        "flute",
        "trumpet",
        "cello",
        "saxophone",
        "harp",
        "clarinet",
        "drum",
        "bass",
        "oboe",
    },
    "days of the week": {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"},
    "months": {
        "january",
        "february",
        "march",
        "april",
        "may",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
    },
    "body parts": {
        "head",
        "arm",
        "leg",
        "hand",
        "foot",
        "eye",
        "ear",
        "nose",
        "mouth",
        "heart",
        "knee",
        "finger",
        "shoulder",
        "neck",
    },
    "seasons and weather words": {
        "rain",
        "snow",
        "sun",
        "wind",
        "storm",
        "fog",
        "cloud",
        "hail",
        "summer",
        "winter",
        "spring",
        "autumn",
        "fall",
    },
    "flowers": {
        "rose",
        "tulip",
        "daisy",
        "lily",
        "sunflower",
        "orchid",
        "daffodil",
        "lavender",
        "poppy",
        "violet",
        "jasmine",
        "iris",
    },
    "drinks": {"water", "tea", "coffee", "milk", "juice", "beer", "wine", "soda", "lemonade", "cocoa"},
    "trees": {"oak", "pine", "maple", "birch", "willow", "palm", "elm", "cedar", "spruce", "fir", "ash"},
    "vehicles": {
        "car",
        "bus",
        "truck",
        "bicycle",
        "bike",
        "train",
        "plane",
        "boat",
        "ship",
        "motorcycle",
        "taxi",
        "van",
        "tram",
    },
    "shapes": {
        "circle",
        "square",
        "triangle",
        "rectangle",
        "oval",
        "hexagon",
        "pentagon",
        "star",
        "diamond",
        "cube",
        "sphere",
    },
    "kitchen tools": {
        "knife",
        "fork",
        "spoon",
        "pan",
        "pot",
        "whisk",
        "spatula",
        "ladle",
        "grater",
        "kettle",
        "blender",
        "toaster",
    },
    "clothes": {
        "shirt",
        "pants",
        "dress",
        "skirt",
        "jacket",
        "coat",
        "hat",
        "sock",
        "socks",
        "shoes",
        "scarf",
        "sweater",
        "jeans",
    },
    "oceans and seas": {
        "pacific",
        "atlantic",
        "indian",
        "arctic",
        "southern",
        "mediterranean",
        "caribbean",
        "baltic",
    },
    "insects": {
        "ant",
        "bee",
        "fly",
        "mosquito",
        "butterfly",
        "beetle",
        "wasp",
        "moth",
        "grasshopper",
        "ladybug",
        "cricket",
        "dragonfly",
    },
    "furniture": {
        "chair",
        "table",
        "bed",
        "sofa",
        "desk",
        "couch",
        "shelf",
        "cabinet",
        "stool",
        "wardrobe",
        "dresser",
        "bench",
    },
    "fish": {
        "salmon",
        "tuna",
        "trout",
        "cod",
        "shark",
        "carp",
        "bass",
        "sardine",
        "goldfish",
        "catfish",
        "herring",
        "mackerel",
    },
}
VALIDATION = ("planets", "birds", "flowers", "trees", "vehicles", "insects", "furniture", "fish")
FORMAT = re.compile(r"[a-z]+(?: [a-z]+)?(?:, [a-z]+(?: [a-z]+)?){2}")
SYSTEM_PROMPT = "Reply with only a comma-separated list, like: red, green, blue"


def score_answer(answer: str, category: str) -> tuple[float, str]:
    """(reward, why) of one answer: 1.0 only for `a, b, c`, three different members of `category`.

    >>> score_answer("apple, pear, plum", "fruits")
    (1.0, 'ok')
    >>> score_answer("Apple, pear, plum.", "fruits")
    (0.0, 'format')
    >>> score_answer("apple, apple, plum", "fruits")
    (0.0, 'repeated')
    >>> score_answer("apple, pear, carrot", "fruits")
    (0.0, 'not in category')
    """
    text = answer.strip()
    if not FORMAT.fullmatch(text):
        return 0.0, "format"
    items = text.split(", ")
    if len(set(items)) != 3:
        return 0.0, "repeated"
    if not all(item in CATEGORIES[category] for item in items):
        return 0.0, "not in category"
    return 1.0, "ok"


class StrictListTask:
    """Scenarios are categories; a rollout asks once and scores the answer all or nothing."""

    name = "strict_list"

    def scenarios(self, split: str) -> list[dict[str, Any]]:
        if split not in ("train", "validation"):
            raise ValueError(f"split {split!r} is unknown; use 'train' or 'validation'")
        names = [c for c in CATEGORIES if (c in VALIDATION) == (split == "validation")]
        return [{"category": c} for c in names]

    async def rollout(self, model: ModelHandle, scenario: dict[str, Any]) -> Trajectory:
        traj = Trajectory(
            messages=[
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": f"Name three {scenario['category']}."},
            ],
            metadata={"category": scenario["category"]},
        )
        traj.add_choice(await model.complete(traj.messages))
        reward, why = score_answer(traj.completion, scenario["category"])
        traj.reward = reward
        traj.rewards["strict"] = reward
        traj.metrics.update(success=reward, format_ok=float(why != "format"))
        return traj


def make_task() -> StrictListTask:
    return StrictListTask()
