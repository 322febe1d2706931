"""Tasks: families (params, prompt, setup, gold, reference solution), instances, validators, failure modes.

    from fhirgym.tasks import TaskWorld, families, make_instance
    world = TaskWorld.open(path_of_a_world_file)
    inst = make_instance("scheduling.book_first_free_slot", seed=3, world=world)
    with inst.open() as fork:           # isolated store at the pre-run state
        ...                              # the reference solution works through fork.toolbox()
        verdict = fork.finish(final_answer)

Agents never get a fork: they work in a :class:`fhirgym.env.Episode`.
"""

from . import _builtin  # noqa: F401  (families() loads the built-in library on first use)
from ._answer import NOT_FOUND, AnswerSpec, Field, answer_text, parse_answer, render
from ._check import check, figures
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
from ._mutate import EQUIVALENTS, MUTATIONS
from ._paraphrase import (
    ParaphraseUnavailable,
    cached_paraphrase,
    offline_paraphrase,
    paraphrase,
    paraphrase_source,
    written_paraphrase,
    written_phrasings,
)

__all__ = [
    "CATEGORIES",
    "CATEGORY_TITLES",
    "DEFAULT_SUBSET",
    "EQUIVALENTS",
    "MODES",
    "MUTATIONS",
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
    "ParaphraseUnavailable",
    "TaskInfeasible",
    "TaskWorld",
    "Verdict",
    "View",
    "answer_text",
    "cached_paraphrase",
    "check",
    "diff",
    "failure_modes",
    "failure_modes_of",
    "families",
    "figures",
    "frozen_now",
    "get_family",
    "make_instance",
    "mark",
    "match",
    "offline_paraphrase",
    "paraphrase",
    "paraphrase_source",
    "parse_answer",
    "proximity",
    "register",
    "render",
    "select",
    "written_paraphrase",
    "written_phrasings",
]
