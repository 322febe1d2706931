"""``string`` rows ``(param, norm, exact)``: primitives, and the parts of HumanName and Address."""

from __future__ import annotations

from typing import Any

from ..values import norm


def s_prim(v: Any, out: list, code: Any) -> None:
    if v.__class__ is str and v:
        out.append((code, norm(v), v))


def _s_parts(v: Any, out: list, code: Any, fields: tuple[str, ...]) -> None:
    if v.__class__ is not dict:
        return
    for f in fields:
        x = v.get(f)
        if x is None:
            continue
        for y in x if x.__class__ is list else (x,):
            if y.__class__ is str and y:
                out.append((code, norm(y), y))


_NAME_PARTS = ("family", "given", "prefix", "suffix", "text")
_ADDRESS_PARTS = ("line", "city", "district", "state", "postalCode", "country", "text")


def s_name(v: Any, out: list, code: Any) -> None:
    _s_parts(v, out, code, _NAME_PARTS)


def s_address(v: Any, out: list, code: Any) -> None:
    _s_parts(v, out, code, _ADDRESS_PARTS)
