"""``date`` rows ``(param, lo, hi)``: half-open epoch seconds of dates, Periods and Timings (open
ends MIN_TIME / MAX_TIME)."""

from __future__ import annotations

from typing import Any

from ..._values import MAX_TIME, MIN_TIME
from ..values import DATES, date_of


def d_prim(v: Any, out: list, code: Any) -> None:
    if v.__class__ is str:
        r = DATES[v]
        if r is not None:
            out.append((code, r[0], r[1]))


def d_period(v: Any, out: list, code: Any) -> None:
    if v.__class__ is not dict:
        return
    start = v.get("start")
    end = v.get("end")
    if start is None and end is None:
        return
    lo = MIN_TIME
    hi = MAX_TIME
    if start is not None:
        r = date_of(start)
        if r is None:
            return
        lo = r[0]
    if end is not None:
        r = date_of(end)
        if r is None:
            return
        hi = r[1]
    out.append((code, lo, hi))


def d_timing(v: Any, out: list, code: Any) -> None:
    if v.__class__ is not dict:
        return
    events = v.get("event")
    if events.__class__ is list:
        for e in events:
            d_prim(e, out, code)
    repeat = v.get("repeat")
    if repeat.__class__ is dict and "boundsPeriod" in repeat:
        d_period(repeat["boundsPeriod"], out, code)
