"""``number`` rows ``(param, lo, hi, value)``: numbers, Quantity values and both ends of a Range."""

from __future__ import annotations

from typing import Any

from ..values import num_range


def n_num(v: Any, out: list, code: Any) -> None:
    r = num_range(v)
    if r is not None:
        out.append((code, r[0], r[1], r[2]))


def n_range(v: Any, out: list, code: Any) -> None:
    if v.__class__ is dict:
        for end in (v.get("low"), v.get("high")):
            if end.__class__ is dict:
                n_num(end.get("value"), out, code)


def n_quantity(v: Any, out: list, code: Any) -> None:
    if v.__class__ is dict:
        n_num(v.get("value"), out, code)
