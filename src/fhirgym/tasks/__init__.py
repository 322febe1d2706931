"""Tasks: families (params, prompt, setup, gold, reference solution), instances, validators, failure modes.

    from fhirgym.tasks import TaskWorld, families, make_instance
    world = TaskWorld.open(path_of_a_world_file)
    inst = make_instance("scheduling.book_first_free_slot", seed=3, world=world)
    with inst.open() as fork:           # isolated store at the pre-run state
        ...                              # the reference solution works through fork.toolbox()
        verdict = fork.finish(final_answer)

Agents never get a fork: they work in a :class:`fhirgym.env.Episode`.
"""

from ._answer import NOT_FOUND, AnswerSpec, Field, answer_text, parse_answer, render
from ._diff import Change, diff, mark
from ._expect import Check, Expect, match
from ._failure import MODES, failure_modes, failure_modes_of, proximity
from ._family import (
    CATEGORIES,
    CATEGORY_TITLES,
    DEFAULT_SUBSET,
    Family,
    Fork,
    Gold,
    Instance,
    TaskInfeasible,
    TaskWorld,
    Verdict,
    View,
    families,
    frozen_now,
    get_family,
    make_instance,
    register,
    select,
)

__all__ = [
    "CATEGORIES",
    "CATEGORY_TITLES",
    "DEFAULT_SUBSET",
    "MODES",
    "NOT_FOUND",
    "AnswerSpec",
    "Change",
    "Check",
    "Expect",
    "Family",
    "Field",
    "Fork",
    "Gold",
    "Instance",
    "TaskInfeasible",
    "TaskWorld",
    "Verdict",
    "View",
    "answer_text",
    "diff",
    "failure_modes",
    "failure_modes_of",
    "families",
    "frozen_now",
    "get_family",
    "make_instance",
    "mark",
    "match",
    "parse_answer",
    "proximity",
    "register",
    "render",
    "select",
]
