"""The two ways judging fails, kept apart because callers treat them differently.

`InvalidJudgment` is a reply that breaks the requested format (not JSON, wrong ids, a score out of
range). It is raised by pure validation code and is recoverable: the judge is shown the error once
and asked to repair its reply.

`JudgeError` is final: the endpoint kept failing, or the repaired reply was still invalid. A
trainer counts it and drops the group (a bad judgment is data, not a crash); the calibration
commands report it per item.
"""

from __future__ import annotations


class InvalidJudgment(ValueError):
    """The judge's reply does not follow the requested JSON format; the message says how."""


class JudgeError(RuntimeError):
    """Judging failed for good (endpoint errors after retries, or an unrepairable reply)."""
