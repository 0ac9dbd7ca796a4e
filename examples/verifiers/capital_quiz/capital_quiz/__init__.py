"""capital-quiz: a verifiers taskset written for grooves' tests and results (docs/environments.md)."""

from capital_quiz.taskset import CapitalQuizTaskset

__all__ = ["CapitalQuizTaskset"]
