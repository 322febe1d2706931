"""``token`` rows ``(param, system, code, text)``: codes, booleans, Codings, CodeableConcepts,
Identifiers and ContactPoints."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from ..._json import FhirDecimal
from ..values import norm


def t_prim(v: Any, out: list, code: Any, system: str | None = None) -> None:
    if v.__class__ is str and v:
        out.append((code, system, v, None))


def t_bool(v: Any, out: list, code: Any) -> None:
    if v is True:
        out.append((code, None, "true", None))
    elif v is False:
        out.append((code, None, "false", None))


def t_int(v: Any, out: list, code: Any) -> None:
    if v.__class__ is int or v.__class__ is Decimal:
        out.append((code, None, str(v), None))
    elif v.__class__ is FhirDecimal and v.is_integer_text:
        out.append((code, None, v.text, None))


def t_coding(v: Any, out: list, code: Any) -> None:
    if v.__class__ is not dict:
        return
    system = v.get("system")
    c = v.get("code")
    d = v.get("display")
    text = norm(d) if d.__class__ is str and d else None
    if system is not None or c is not None or text is not None:
        out.append((code, system, c, text))


def t_cc(v: Any, out: list, code: Any) -> None:
    """A row per coding (text: its display, else the concept's text), plus a text-only row when the
    concept's text is carried by no coding row, so ``:text`` finds ``CodeableConcept.text``."""
    if v.__class__ is not dict:
        return
    t = v.get("text")
    ntext = norm(t) if t.__class__ is str and t else None
    carried = False
    codings = v.get("coding")
    if codings:
        for c in codings if codings.__class__ is list else (codings,):
            if c.__class__ is not dict:
                continue
            system = c.get("system")
            cc = c.get("code")
            d = c.get("display")
            text = norm(d) if d.__class__ is str and d else ntext
            if system is not None or cc is not None or text is not None:
                out.append((code, system, cc, text))
                carried = carried or (text is not None and text == ntext)
    if ntext is not None and not carried:
        out.append((code, None, None, ntext))


def t_identifier(v: Any, out: list, code: Any) -> None:
    if v.__class__ is not dict:
        return
    system = v.get("system")
    value = v.get("value")
    if system is None and value is None:
        return
    typ = v.get("type")
    t = typ.get("text") if typ.__class__ is dict else None
    out.append((code, system, value, norm(t) if t.__class__ is str and t else None))


def t_contactpoint(v: Any, out: list, code: Any) -> None:
    if v.__class__ is dict:
        value = v.get("value")
        if value is not None:
            out.append((code, v.get("system"), value, None))
