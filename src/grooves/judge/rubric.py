"""Rubrics as data: named, weighted criteria with ordered choices, loaded from versioned TOML files.

A rubric is what a person iterates on during calibration, so it lives in a file with a `version`
the person bumps and a content hash grooves computes. Both go into every score record: two score
files can always be told apart, and a score is never silently compared against a changed rubric.

The hash is taken over the rubric's canonical content (the parsed data, sorted JSON), not the file
bytes, so reformatting or commenting the TOML does not change it while any change of wording does.

Each criterion is either categorical (`choices`, ordered worst to best; choice k of n is worth
k/(n-1)) or numeric (the judge answers a number in [0, 1]). The total is the weighted mean of the
criteria values, so it stays in [0, 1] whatever the weights. A criterion marked `gate = true` is a
hard failure: when its value is below 0.5 (on ["no", "yes"], a "no") the total is 0, whatever the
other criteria say, because a weighted criterion can only pull the mean down, never veto it.

Example (`examples/rubrics/helpful.toml`):

    name = "helpful"
    version = "1"
    instructions = "Judge how well each response answers the user's question."

    [[criteria]]
    name = "correct"
    text = "Is the answer factually correct?"
    weight = 2.0
    choices = ["no", "partly", "yes"]

    [[criteria]]
    name = "no_invention"
    text = "Does the response avoid inventing facts?"
    choices = ["no", "yes"]
    gate = true
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class RubricError(ValueError):
    """A rubric file is missing, unreadable or invalid; the message names the field and the fix."""


class Criterion(BaseModel):
    """One thing the judge rates, on its own scale."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    """Key of this criterion in the judge's JSON and in score records (letters, digits, `_`, `-`)."""
    text: str = Field(min_length=1)
    """The question the judge answers for this criterion, in plain words."""
    weight: float = 1.0
    """Relative weight in the total (> 0). Raising one weight makes the total track that criterion."""
    choices: list[str] | None = None
    """Ordered labels, worst first (e.g. ["no", "partly", "yes"]). Labels are easier for a small judge
    than numbers and make its answers comparable across runs; None asks for a number in [0, 1]."""
    gate: bool = False
    """A hard failure: a value below 0.5 (the worst of ["no", "yes"]) sets the rubric's total to 0.
    It still counts in the weighted mean when it passes. Use it for what must never happen; a
    weighted criterion cannot outweigh the others, a gate can."""

    @field_validator("name")
    @classmethod
    def _name_is_key(cls, v: str) -> str:
        if not all(c.isalnum() or c in "_-" for c in v):
            raise ValueError(f"criterion name {v!r} must use only letters, digits, '_' or '-'")
        return v

    @field_validator("weight")
    @classmethod
    def _weight_positive(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"weight must be > 0, got {v}; drop the criterion instead of weighting it 0")
        return v

    @field_validator("choices")
    @classmethod
    def _choices_distinct(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if len(v) < 2:
            raise ValueError(f"choices needs at least 2 labels (worst first), got {v}")
        lowered = [c.strip().lower() for c in v]
        if len(set(lowered)) != len(lowered) or any(not c for c in lowered):
            raise ValueError(f"choices must be distinct non-empty labels, got {v}")
        return v

    def value_of(self, verdict: object) -> float:
        """Map a judge's verdict for this criterion to [0, 1], or raise ValueError saying why not.

        Categorical: the label's position k in `choices` gives k / (len(choices) - 1).
        Numeric: the number itself, which must lie in [0, 1].

        >>> Criterion(name="c", text="t", choices=["no", "partly", "yes"]).value_of("Partly")
        0.5
        """
        if self.choices is not None:
            labels = [c.strip().lower() for c in self.choices]
            if isinstance(verdict, str) and verdict.strip().lower() in labels:
                return labels.index(verdict.strip().lower()) / (len(labels) - 1)
            raise ValueError(f"criterion {self.name!r}: {verdict!r} is not one of {self.choices}")
        if isinstance(verdict, bool) or not isinstance(verdict, int | float):
            raise ValueError(f"criterion {self.name!r}: {verdict!r} is not a number in [0, 1]")
        if not 0.0 <= float(verdict) <= 1.0:
            raise ValueError(f"criterion {self.name!r}: {verdict} is out of range [0, 1]")
        return float(verdict)

    def scale(self) -> str:
        """How the judge must answer, as shown in the prompt."""
        if self.choices is not None:
            return "one of " + ", ".join(json.dumps(c) for c in self.choices) + " (worst to best)"
        return "a number from 0.0 (worst) to 1.0 (best)"


class Rubric(BaseModel):
    """A versioned set of criteria plus the judge's instructions."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    """Bumped by the person editing the rubric; recorded with every score next to the hash."""
    instructions: str = "Judge how well each response accomplishes the task given in the context."
    """What the task is and what a good response looks like; shown to the judge before the criteria."""
    criteria: list[Criterion] = Field(min_length=1)

    @field_validator("version", mode="before")
    @classmethod
    def _version_as_text(cls, v: object) -> object:
        # `version = 2` in TOML is an int; accept it so the file reads naturally.
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @model_validator(mode="after")
    def _unique_names(self) -> Rubric:
        names = [c.name for c in self.criteria]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"criteria names must be unique; repeated: {', '.join(dupes)}")
        return self

    @property
    def content_hash(self) -> str:
        """sha256 (first 12 hex digits) of the canonical JSON of the rubric's content.

        `gate` enters only where it is set, so rubrics without gates keep the hash they had before
        criteria could be gates."""
        data = self.model_dump(mode="json")
        for c in data["criteria"]:
            if not c["gate"]:
                del c["gate"]
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]

    @property
    def tag(self) -> str:
        """`name@version#hash`: how score records and reports name a rubric."""
        return f"{self.name}@{self.version}#{self.content_hash}"

    def total(self, values: dict[str, float]) -> float:
        """Weighted mean of criterion values: sum_c w_c v_c / sum_c w_c, in [0, 1]; 0 when a gate
        criterion's value is below 0.5.

        >>> r = Rubric(name="r", version="1", criteria=[
        ...     Criterion(name="a", text="a?", weight=3.0), Criterion(name="b", text="b?")])
        >>> r.total({"a": 1.0, "b": 0.0})
        0.75
        >>> g = Rubric(name="g", version="1", criteria=[
        ...     Criterion(name="a", text="a?", weight=3.0), Criterion(name="safe", text="s?", gate=True)])
        >>> g.total({"a": 1.0, "safe": 1.0}), g.total({"a": 1.0, "safe": 0.0})
        (1.0, 0.0)
        """
        missing = [c.name for c in self.criteria if c.name not in values]
        if missing:
            raise ValueError(f"missing criteria values: {', '.join(missing)}")
        if self.closed_gates(values):
            return 0.0
        weight = sum(c.weight for c in self.criteria)
        return sum(c.weight * values[c.name] for c in self.criteria) / weight

    def closed_gates(self, values: dict[str, float]) -> list[str]:
        """Names of the gate criteria whose value is below 0.5."""
        return [c.name for c in self.criteria if c.gate and values.get(c.name, 1.0) < 0.5]

    def to_toml(self) -> str:
        """The rubric as a TOML file that `load_rubric` reads back to an equal rubric.

        Weights are always written; `choices` when set; `gate` only where it is true.

        >>> print(Rubric(name="r", version="1", instructions="Judge.", criteria=[
        ...     Criterion(name="ok", text="Is it right?", choices=["no", "yes"], gate=True)]).to_toml())
        name = "r"
        version = "1"
        instructions = "Judge."
        <BLANKLINE>
        [[criteria]]
        name = "ok"
        text = "Is it right?"
        weight = 1.0
        choices = ["no", "yes"]
        gate = true
        <BLANKLINE>
        """
        lines = [f"name = {_toml_str(self.name)}", f"version = {_toml_str(self.version)}"]
        lines.append(f"instructions = {_toml_str(self.instructions)}")
        for c in self.criteria:
            lines += ["", "[[criteria]]", f"name = {_toml_str(c.name)}", f"text = {_toml_str(c.text)}"]
            lines.append(f"weight = {c.weight!r}")
            if c.choices is not None:
                lines.append(f"choices = [{', '.join(_toml_str(x) for x in c.choices)}]")
            if c.gate:
                lines.append("gate = true")
        text = "\n".join(lines) + "\n"
        assert Rubric.model_validate(tomllib.loads(text)) == self, "to_toml must round-trip"
        return text


def _toml_str(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, except DEL, which TOML wants escaped."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


DEFAULT_RUBRIC = Rubric(
    name="default",
    version="1",
    instructions=(
        "Judge how well each response accomplishes the task given in the context. Reward responses "
        "that do what was asked, correctly and completely; penalize responses that are wrong, off-task, "
        "padded, or that only look like an answer."
    ),
    criteria=[Criterion(name="overall", text="How well does the response accomplish the task?")],
)
"""One numeric criterion: the RULER-like default when no rubric file is given."""


def load_rubric(path: str | Path) -> Rubric:
    """Read a rubric from a TOML file; errors name the file, the field and what is allowed."""
    path = Path(path)
    if path.suffix.lower() != ".toml":
        raise RubricError(f"{path}: rubric files are TOML; rename it to *.toml (got suffix {path.suffix!r})")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise RubricError(f"rubric file not found: {path}") from exc
    return parse_rubric(text, str(path))


def parse_rubric(text: str, where: str = "rubric") -> Rubric:
    """A rubric from TOML text, checked as `load_rubric` checks a file; errors start with `where`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RubricError(f"{where}: not valid TOML: {exc}") from exc
    return rubric_from_data(data, where)


def rubric_from_data(data: object, where: str = "rubric") -> Rubric:
    """A rubric from parsed data; a RubricError names the first bad field and the fix."""
    try:
        return Rubric.model_validate(data)
    except ValidationError as exc:
        raise RubricError(f"{where}: {_first_error(exc)}") from exc


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "rubric"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field; allowed: name, version, instructions, [[criteria]] with name, text, weight, choices, gate"
    elif err["type"] == "missing":
        msg = "required field is missing"
    return f"{where}: {msg}"
