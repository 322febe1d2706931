"""The two tracks, as values: what names an instance, which loop its reference runs in, its negative reply.

The runner, RL and the inspect bridge look a track up here instead of testing its name, so what differs
between the action families and the QA questions is said once, and a third track is one more entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._answer import NOT_FOUND, answer_text


@dataclass(frozen=True)
class Track:
    """One kind of task instance."""

    name: str
    ident: str  # the field that names an instance within its family: a seed, or a question's id
    by_question: bool  # instances are the questions of a split (so --split decides them), not seeds of a family
    loop: str  # the agent loop its reference trajectories run in: "react" or "codeact"
    config: str  # the configuration those trajectories (and the loop) use
    negative: str  # the constant reply that claims the record holds nothing
    negative_name: str  # how the floors name that reply
    env_class: str  # the RL rows' env_class

    @property
    def seeded(self) -> bool:
        """Whether an instance is a family's seed: sealed runs and paraphrases apply."""
        return not self.by_question

    def floor_names(self, constants: tuple[str, ...]) -> tuple[str, ...]:
        """The constant replies' names as this track says them (its negative reply's name)."""
        return tuple(c.replace("nothing-found", self.negative_name) for c in constants)


ACTION = Track("action", "seed", False, "react", "baseline", answer_text(NOT_FOUND), "nothing-found",
               "fhirgym-action")
QA = Track("qa", "question_id", True, "codeact", "codeact", "The final answer is: no answer", "no-answer",
           "fhirgym-qa")
#: Every track by name; ACTION is the default.
TRACKS: dict[str, Track] = {t.name: t for t in (ACTION, QA)}


def get_track(name: str | Track) -> Track:
    """The track called ``name`` (a :class:`Track` passes through); a clear error for any other name."""
    if isinstance(name, Track):
        return name
    try:
        return TRACKS[name]
    except KeyError:
        raise ValueError(f"unknown track {name!r}; use {' or '.join(TRACKS)}") from None
