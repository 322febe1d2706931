"""Slot counts: free slots of a specialty, urgent slots."""

from __future__ import annotations

import random
from bisect import bisect_left
from datetime import UTC, date, datetime, timedelta

from ....tools import Toolbox
from ... import AnswerSpec, Family, Field, Gold, View, answer_text, register
from ...draw import deal_by_gold
from ...facts import (
    Slot,
)
from ._scheduling_common import NUMBER_WORDS, _Facts, _facts, _iso, _long_date, _midnight, _total, _window


def _urgent(f: _Facts, lo: datetime, hi: datetime, specialty: str | None) -> list[Slot]:
    """Free urgent slots with ``lo <= start < hi`` (of one specialty, or all)."""
    out = f.urgent_free[bisect_left(f.urgent_starts, lo):bisect_left(f.urgent_starts, hi)]
    return [s for s in out if specialty is None or f.by_schedule[s.schedule].spec == specialty]


@register("scheduling.count_specialty_slots", difficulty=2, touches=("Slot",),
          sequences=(("searchResources",),))
class CountSpecialtySlots(Family):
    """Count the free slots of a specialty between two dates

    A count over several doctors and days: needs a server-side count or careful paging."""

    answer = AnswerSpec((Field("count", "int", "the number of free slots"),))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        f = _facts(view)
        today = view.now.date()
        first = today + timedelta(days=rng.randint(1, 10))
        while first.weekday() >= 5:
            first += timedelta(days=1)
        last = first + timedelta(days=rng.choice((0, 0, 1, 2, 4)))
        params = {"specialty": rng.choice(sorted({d.spec for d in f.docs})), "first": first.isoformat(),
                  "last": last.isoformat(), "urgent_included": rng.random() < 0.5}
        return params if self._count(f, params) else None

    @staticmethod
    def _count(f: _Facts, params: dict) -> int:
        docs = [d for d in f.docs if d.spec == params["specialty"]]
        lo = _midnight(date.fromisoformat(params["first"]))
        hi = _midnight(date.fromisoformat(params["last"]) + timedelta(days=1))
        return len(_window(f, docs, lo, hi, routine=not params["urgent_included"]))

    def prompt(self, params: dict) -> str:
        when = (f"on {_long_date(params['first'])}" if params["first"] == params["last"] else
                f"from {_long_date(params['first'])} through {_long_date(params['last'])} (both days included)")
        kind = ("Count every free slot, including the ones reserved for urgent visits." if params["urgent_included"]
                else "Count only slots for routine visits: leave out the ones reserved for urgent visits.")
        return (f"For capacity planning: how many free {params['specialty']} appointment slots do we have {when}, "
                f"across all our {params['specialty']} doctors? {kind}")

    def gold(self, view: View, params: dict) -> Gold:
        return Gold(answer={"count": self._count(_facts(view), params)})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        after = (date.fromisoformat(params["last"]) + timedelta(days=1)).isoformat()
        query = {"specialty:text": params["specialty"], "status": "free",
                 "start": [f"ge{params['first']}", f"lt{after}"]}
        if not params["urgent_included"]:
            query["appointment-type"] = "ROUTINE"
        return answer_text({"count": _total(tools, "Slot", query)})


@register("scheduling.count_urgent_slots", difficulty=2, touches=("Slot",), sequences=(("searchResources",),))
class CountUrgentSlots(Family):
    """Count the free urgent-visit slots at a given time of day over the next days

    Urgent slots are marked by appointmentType EMERGENCY; the window starts now, not at midnight."""

    answer = AnswerSpec((Field("count", "int", "the number of free urgent-visit slots"),))

    def sample(self, view: View, rng: random.Random) -> dict | None:
        f = _facts(view)
        candidates = []  # (count, params): the counts are dealt by seed, so no count is the gold of many seeds
        for days in (2, 3, 4, 5, 7):
            for specialty in [None, *sorted({d.spec for d in f.docs})]:
                urgent = _urgent(f, view.now, _midnight(view.now.date() + timedelta(days=days + 1)), specialty)
                for time in sorted({s.at.strftime("%H:%M") for s in urgent}):
                    count = sum(1 for s in urgent if s.at.strftime("%H:%M") == time)
                    candidates.append((count, {"specialty": specialty, "days": days, "time": time}))
        return deal_by_gold(view, rng, candidates)

    def prompt(self, params: dict) -> str:
        scope = f"{params['specialty']} " if params["specialty"] else ""
        across = f"all our {params['specialty']} doctors" if params["specialty"] else "all doctors and specialties"
        n = params["days"]
        return (f"How many {scope}slots reserved for urgent visits, starting at {params['time']}, are still free "
                f"today or within the next {NUMBER_WORDS[n]} days (up to and including the day {n} days from today), "
                f"across {across}? Only count slots that start at or after the current time.")

    def gold(self, view: View, params: dict) -> Gold:
        hi = _midnight(view.now.date() + timedelta(days=params["days"] + 1))
        count = sum(1 for s in _urgent(_facts(view), view.now, hi, params["specialty"])
                    if s.at.strftime("%H:%M") == params["time"])
        return Gold(answer={"count": count})

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        count = 0
        hh, mm = (int(x) for x in params["time"].split(":"))
        for n in range(params["days"] + 1):
            day = now.date() + timedelta(days=n)
            start = datetime(day.year, day.month, day.day, hh, mm, tzinfo=UTC)
            if start < now:
                continue
            query = {"appointment-type": "EMERGENCY", "status": "free", "start": _iso(start)}
            if params["specialty"]:
                query["specialty:text"] = params["specialty"]
            count += _total(tools, "Slot", query)
        return answer_text({"count": count})
