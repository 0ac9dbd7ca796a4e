"""Three questions in one conversation: a scripted user asks a country's capital, reads the answer,
asks the next. Every answer is a sampled turn; the user's questions between them are context.

The reward is the fraction of the three answers that name the right capital in at most six
words on one line. Episodes are built from a fixed table with a fixed seed, so the taskset is
offline and the same everywhere; `split = "test"` draws its countries from the 20 that
training never asks about.
"""

import random
import re

import verifiers.v1 as vf

COUNTRIES = [
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
TRAIN_COUNTRIES = 40
QUESTIONS = 3
MAX_WORDS = 6


class CapitalChainData(vf.TaskData):
    questions: list[str]
    """The user's questions, in the order asked."""
    answers: list[str]
    """The capital each question asks for."""


def _named(reply: str, capital: str) -> bool:
    reply = reply.strip()
    return (
        capital.lower() in reply.lower() and "\n" not in reply and len(re.findall(r"\w+", reply)) <= MAX_WORDS
    )


class CapitalChainTask(vf.Task[CapitalChainData]):
    @vf.reward(weight=1.0)
    async def answered(self, trace: vf.Trace) -> float:
        replies = [m.content or "" for m in trace.assistant_messages]
        hits = [i < len(replies) and _named(replies[i], a) for i, a in enumerate(self.data.answers)]
        return sum(hits) / len(self.data.answers)


class CapitalChainEnv(vf.SingleAgentEnv):
    """The scripted user: each question is one turn of the conversation."""

    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            for question in task.data.questions:
                if (await interaction.turn(question)).terminated:
                    break


class CapitalChainConfig(vf.TasksetConfig):
    split: str = "train"
    """train: questions about the first 40 countries; test: about the other 20."""
    episodes: int = 40
    """How many episodes to draw."""


class CapitalChainTaskset(vf.Taskset[CapitalChainTask, CapitalChainConfig]):
    def load(self) -> list[CapitalChainTask]:
        pool = COUNTRIES[:TRAIN_COUNTRIES] if self.config.split == "train" else COUNTRIES[TRAIN_COUNTRIES:]
        rng = random.Random(f"capital-chain-{self.config.split}")
        tasks = []
        for i in range(self.config.episodes):
            picked = rng.sample(pool, QUESTIONS)
            data = CapitalChainData(
                idx=i,
                prompt=None,
                questions=[f"What is the capital of {country}?" for country, _ in picked],
                answers=[capital for _, capital in picked],
            )
            tasks.append(CapitalChainTask(data, self.config.task))
        return tasks
