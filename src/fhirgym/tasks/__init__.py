"""Tasks: families (params, prompt, setup, gold, reference solution), instances, validators, failure modes.

    from fhirgym.tasks import TaskWorld, families, make_instance
    world = TaskWorld.open(path_of_a_world_file)
    inst = make_instance("scheduling.book_first_free_slot", seed=3, world=world)
    with inst.open() as fork:           # isolated store at the pre-run state
        verdict = fork.finish(final_answer, calls=box.calls)   # the reference works through box = fork.toolbox()

Agents never get a fork: they work in a :class:`fhirgym.env.Episode`. Writing a family takes only what this package
exports, the authoring kit of docs/TASKS.md (``Family``, ``register``, ``Gold``, ``checks``, ``facts``, ...).
"""

from ..spec import codes
from . import checks, draw, facts, solve
from ._answer import NOT_FOUND, AnswerSpec, Field, answer_text, parse_answer, parse_instant, render
from ._check import CheckSummary, check, figures
from ._diff import Change, diff, mark
from ._evidence import looked_at
from ._expect import Expect, match
from ._failure import MODES, failure_modes, failure_modes_of, proximity
from ._family import (
    CATEGORIES,
    CATEGORY_TITLES,
    DEFAULT_SUBSET,
    ENTRY_POINT_GROUP,
    WRITE_TOOLS,
    FamiliesUnavailable,
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
    load_families,
    make_instance,
    register,
    select,
)
from ._mutate import EQUIVALENTS, MUTATIONS
from ._paraphrase import (
    ParaphraseUnavailable,
    cached_paraphrase,
    family_phrasings,
    offline_paraphrase,
    paraphrase,
    paraphrase_source,
    written_paraphrase,
    written_phrasings,
)
from ._seeds import parse_seeds
from ._split import heldout_split
from ._track import ACTION, QA, TRACKS, Track, get_track
from .checks import Check
from .draw import EitherWay, deal, pick

__all__ = [
    "ACTION",
    "CATEGORIES",
    "CATEGORY_TITLES",
    "DEFAULT_SUBSET",
    "ENTRY_POINT_GROUP",
    "EQUIVALENTS",
    "MODES",
    "MUTATIONS",
    "NOT_FOUND",
    "QA",
    "TRACKS",
    "WRITE_TOOLS",
    "AnswerSpec",
    "Change",
    "Check",
    "CheckSummary",
    "EitherWay",
    "Expect",
    "FamiliesUnavailable",
    "Family",
    "Field",
    "Fork",
    "Gold",
    "Instance",
    "ParaphraseUnavailable",
    "TaskInfeasible",
    "TaskWorld",
    "Track",
    "Verdict",
    "View",
    "answer_text",
    "cached_paraphrase",
    "check",
    "checks",
    "codes",
    "deal",
    "diff",
    "draw",
    "facts",
    "failure_modes",
    "failure_modes_of",
    "families",
    "family_phrasings",
    "figures",
    "frozen_now",
    "get_family",
    "get_track",
    "heldout_split",
    "load_families",
    "looked_at",
    "make_instance",
    "mark",
    "match",
    "offline_paraphrase",
    "paraphrase",
    "paraphrase_source",
    "parse_answer",
    "parse_instant",
    "parse_seeds",
    "pick",
    "proximity",
    "register",
    "render",
    "select",
    "solve",
    "written_paraphrase",
    "written_phrasings",
]
