"""``quantity`` rows ``(param, value, lo, hi, system, code, unit)``: Quantities, Money (ISO 4217) and
both ends of a Range."""

from __future__ import annotations

from typing import Any

from ..values import num_range

_ISO4217 = "urn:iso:std:iso:4217"


def q_quantity(v: Any, out: list, code: Any) -> None:
    if v.__class__ is not dict:
        return
    r = num_range(v.get("value"))
    if r is not None:
        out.append((code, r[2], r[0], r[1], v.get("system"), v.get("code"), v.get("unit")))


def q_money(v: Any, out: list, code: Any) -> None:
    if v.__class__ is not dict:
        return
    r = num_range(v.get("value"))
    if r is not None:
        cur = v.get("currency")
        out.append((code, r[2], r[0], r[1], _ISO4217 if cur is not None else None, cur, cur))


def q_range(v: Any, out: list, code: Any) -> None:
    if v.__class__ is dict:
        for end in (v.get("low"), v.get("high")):
            q_quantity(end, out, code)
