"""Name a country's capital in at most six words, on one line: one turn, scored by code.

Rows come from a fixed table, so the taskset is offline and the same on every machine; row
`idx` < 40 are the training rows, the rest are held out (`split = "test"`).
"""

import re

import verifiers.v1 as vf

CAPITALS = [
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Italy", "Rome"),
    ("Germany", "Berlin"),
    ("Spain", "Madrid"),
    ("Egypt", "Cairo"),
    ("Canada", "Ottawa"),
    ("Russia", "Moscow"),
    ("China", "Beijing"),
    ("Greece", "Athens"),
    ("Peru", "Lima"),
    ("Kenya", "Nairobi"),
    ("Norway", "Oslo"),
    ("Poland", "Warsaw"),
    ("Portugal", "Lisbon"),
    ("Austria", "Vienna"),
    ("Sweden", "Stockholm"),
    ("Ireland", "Dublin"),
    ("Cuba", "Havana"),
    ("Chile", "Santiago"),
    ("Thailand", "Bangkok"),
    ("Iran", "Tehran"),
    ("Hungary", "Budapest"),
    ("Finland", "Helsinki"),
    ("Denmark", "Copenhagen"),
    ("Belgium", "Brussels"),
    ("Argentina", "Buenos Aires"),
    ("Mexico", "Mexico City"),
    ("South Korea", "Seoul"),
    ("Vietnam", "Hanoi"),
    ("Indonesia", "Jakarta"),
    ("Philippines", "Manila"),
    ("Turkey", "Ankara"),
    ("Iraq", "Baghdad"),
    ("Syria", "Damascus"),
    ("Lebanon", "Beirut"),
    ("Colombia", "Bogota"),
    ("Venezuela", "Caracas"),
    ("Ukraine", "Kyiv"),
    ("Romania", "Bucharest"),
    ("Bulgaria", "Sofia"),
    ("Serbia", "Belgrade"),
    ("Croatia", "Zagreb"),
    ("Czechia", "Prague"),
    ("Slovakia", "Bratislava"),
    ("Netherlands", "Amsterdam"),
    ("Switzerland", "Bern"),
    ("Morocco", "Rabat"),
    ("Nigeria", "Abuja"),
    ("Ethiopia", "Addis Ababa"),
    ("Ghana", "Accra"),
    ("Australia", "Canberra"),
    ("New Zealand", "Wellington"),
    ("India", "New Delhi"),
    ("Pakistan", "Islamabad"),
    ("Nepal", "Kathmandu"),
    ("Mongolia", "Ulaanbaatar"),
    ("Iceland", "Reykjavik"),
    ("Estonia", "Tallinn"),
    ("Latvia", "Riga"),
]
TRAIN_ROWS = 40
MAX_WORDS = 6


class CapitalQuizData(vf.TaskData):
    answer: str
    """The capital the reply must name."""


class CapitalQuizTask(vf.Task[CapitalQuizData]):
    @vf.stop
    async def one_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def correct_and_short(self, trace: vf.Trace) -> float:
        reply = (trace.last_reply or "").strip()
        words = re.findall(r"\w+", reply)
        named = self.data.answer.lower() in reply.lower()
        return float(named and "\n" not in reply and len(words) <= MAX_WORDS)


class CapitalQuizConfig(vf.TasksetConfig):
    split: str = "train"
    """train: the first 40 countries; test: the other 20, held out."""


class CapitalQuizTaskset(vf.Taskset[CapitalQuizTask, CapitalQuizConfig]):
    def load(self) -> list[CapitalQuizTask]:
        rows = list(enumerate(CAPITALS))
        rows = rows[:TRAIN_ROWS] if self.config.split == "train" else rows[TRAIN_ROWS:]
        return [
            CapitalQuizTask(
                CapitalQuizData(idx=i, prompt=f"What is the capital of {country}?", answer=capital),
                self.config.task,
            )
            for i, (country, capital) in rows
        ]
