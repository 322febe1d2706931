"""Drawing an instance from its seed: fair dealing of candidates, "nothing found" seeds, new people,
and the way people write dates in requests."""

from __future__ import annotations

import hashlib
import random
from datetime import date, datetime, timedelta
from typing import ClassVar

from ._family import Family, Gold, View
from .facts import taken_names

FEMALE_GIVEN = ("Abigail", "Beatrice", "Camille", "Delphine", "Eloise", "Fiona", "Greta", "Harriet", "Imogen",
                "Josephine", "Katarina", "Lorena", "Marisol", "Nadine", "Odette", "Priscilla", "Rosalind",
                "Sabine", "Tamsin", "Ursula", "Valentina", "Wilhelmina", "Yolanda", "Zinnia")
MALE_GIVEN = ("Ambrose", "Barnaby", "Cornelius", "Desmond", "Evander", "Fitzgerald", "Gideon", "Horatio",
              "Ignatius", "Jasper", "Leopold", "Mortimer", "Nikolai", "Oswald", "Percival", "Quentin",
              "Rupert", "Sebastian", "Thaddeus", "Ulysses", "Vincenzo", "Winston", "Xavier", "Zebedee")
FAMILY_NAMES = ("Ashworth", "Blackwood", "Castellano", "Dunmore", "Everly", "Fairbanks", "Galloway",
                "Hargreaves", "Iverson", "Kettleborough", "Lindqvist", "Marchetti", "Northcott", "Okonkwo",
                "Pemberton", "Quigley", "Rasmussen", "Saltonstall", "Thistlewood", "Underhill", "Vasquez-Moreno",
                "Whitcombe", "Yardley", "Zielinski")
STREETS = ("Elm Street", "Maple Avenue", "Chestnut Street", "Harbor View Road", "Pleasant Street",
           "Washington Street", "Orchard Lane", "Beacon Street", "Summer Street", "Prospect Hill Road")
TOWNS = (("Boston", "02118"), ("Cambridge", "02139"), ("Worcester", "01608"), ("Lowell", "01852"),
         ("Springfield", "01103"), ("Quincy", "02169"), ("Somerville", "02144"), ("Salem", "01970"))
AREA_CODES = ("617", "508", "781", "978", "413")


#: Where the "nothing found" seeds fall in each ten of a family's seeds (shifted by a phase of its own):
#: three in ten, never two within three consecutive seeds.
NEGATIVE_SLOTS = (0, 3, 6)


def _phase(view: View) -> int:
    return int(hashlib.sha256(view.family.encode()).hexdigest()[:8], 16) % 10


def negative_seed(view: View) -> bool:
    """Whether this instance is a "nothing found" one, in a family that offers that answer.

    Three of every ten consecutive seeds, spread (:data:`NEGATIVE_SLOTS`) at a phase of the family's own:
    any three consecutive seeds hold at most one negative, so a short run (``--seeds 3``) is never all
    negatives, and over seeds 0–19 both kinds occur (6 negative, 14 positive).
    """
    return (view.seed + _phase(view)) % 10 in NEGATIVE_SLOTS


class EitherWay(Family):
    """A family whose answer may be "nothing found": on :func:`negative_seed` seeds its own hooks
    (``sample_none``, ``setup_none``, ``gold_none``) draw a negative instance, on the others its positive
    sibling's (``found``, same prompt) draw one with an answer, so the reply cannot be guessed."""

    found: ClassVar[type[Family]]

    def sample(self, view: View, rng: random.Random) -> dict | None:
        negative = negative_seed(view)
        params = self.sample_none(view, rng) if negative else self.found.sample(self, view, rng)
        return None if params is None else {**params, "negative": negative}

    def setup(self, view: View, params: dict) -> list[dict]:
        return self.setup_none(view, params) if params["negative"] else self.found.setup(self, view, params)

    def gold(self, view: View, params: dict) -> Gold:
        return self.gold_none(view, params) if params["negative"] else self.found.gold(self, view, params)

    def sample_none(self, view: View, rng: random.Random) -> dict | None:
        raise NotImplementedError

    def setup_none(self, view: View, params: dict) -> list[dict]:
        return []

    def gold_none(self, view: View, params: dict) -> Gold:
        raise NotImplementedError


def deal(view: View, items: list):
    """The item of this seed from a shuffle of its own to the family: consecutive seeds take ``items`` in
    turn, so over 20 seeds none is drawn more than ⌈20/len⌉ times (the gold varies as far as the world lets
    it). A redraw (the sample did not fit) moves on to the next item."""
    if not items:
        return None
    order = sorted(range(len(items)), key=lambda i: hashlib.sha256(f"{view.family}|{i}".encode()).digest())
    return items[order[(view.seed + view.attempt) % len(items)]]


def deal_positive(view: View, items: list):
    """:func:`deal` over the positive seeds only (those :func:`negative_seed` leaves with an answer), for a
    family that offers "nothing found": its positives take ``items`` in turn, whatever seeds are negative."""
    if not items:
        return None
    phase = _phase(view)
    negatives = sum(1 for s in range(view.seed) if (s + phase) % 10 in NEGATIVE_SLOTS)
    order = sorted(range(len(items)), key=lambda i: hashlib.sha256(f"{view.family}|{i}".encode()).digest())
    return items[order[(view.seed - negatives + view.attempt) % len(items)]]


def deal_by_gold(view: View, rng: random.Random, candidates: list[tuple]):
    """For answers that many candidates share (counts): deal the distinct golds by seed (:func:`deal`), then
    draw a candidate with that gold. ``candidates`` are (gold, item) pairs; returns the item."""
    golds = sorted({g for g, _ in candidates})
    gold = deal(view, golds)
    return pick(rng, [item for g, item in candidates if g == gold])


def pick(rng: random.Random, items: list):
    return items[rng.randrange(len(items))] if items else None


def new_name(view: View, rng: random.Random, gender: str, family: str | None = None) -> tuple[str, str] | None:
    """A (given, family) nobody in the world has; ``family`` fixed if given. None if the draw collides."""
    given = rng.choice(FEMALE_GIVEN if gender == "female" else MALE_GIVEN)
    family = family or rng.choice(FAMILY_NAMES)
    return None if (given.casefold(), family.casefold()) in taken_names(view) else (given, family)


def new_phone(rng: random.Random) -> str:
    return f"{rng.choice(AREA_CODES)}-555-01{rng.randrange(100):02d}"


def random_birth(rng: random.Random, lo: date, hi: date) -> date:
    return lo + timedelta(days=rng.randrange((hi - lo).days))


def pronoun(gender: str | None) -> str:
    """The possessive a clerk would write for a person of this gender."""
    return {"female": "her", "male": "his"}.get(gender or "", "their")


def who(name: str, birth: date | str) -> str:
    """'Ana Diaz (born March 4, 1961)': how a request names a patient (name and birth date tell them apart)."""
    return f"{name} (born {human_date(birth)})"


def human_date(d: date | str) -> str:
    """'March 4, 1961' — how people write dates in requests."""
    d = date.fromisoformat(d) if isinstance(d, str) else d
    return f"{d.strftime('%B')} {d.day}, {d.year}"


def human_time(t: datetime) -> str:
    return t.strftime("%H:%M")


class Branched(Family):
    """A family whose instances take one of several branches by seed (a conditional order: the condition
    holds or not), each branch drawn by its own random streams: seed ``s`` is branch ``s % n`` drawn as
    seed ``s // n`` of the stream labelled ``branches[s % n]``. Labels of families merged into one keep
    their old ids, so the merged family reproduces each old family's instances at those seeds."""

    branches: ClassVar[tuple[str, ...]]

    def stream(self, seed: int) -> tuple[str, int]:
        return self.branches[seed % len(self.branches)], seed // len(self.branches)

    def branch(self, view: View) -> int:
        """The branch of the instance ``view`` draws (0 … n-1)."""
        return self.branches.index(view.family)
