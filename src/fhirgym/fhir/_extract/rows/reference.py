"""``reference`` rows ``(param, target_type, target_id, url, ident_system, ident_value)``: References,
canonical/uri values, and inline resources (``Bundle.entry.resource``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..values import RefTypes


def reference_builders(
    refs: RefTypes, known: frozenset[str]
) -> tuple[Callable[..., None], Callable[..., None]]:
    """Reference and inline-resource builders bound to the set of real resource types."""

    def r_reference(v: Any, out: list, code: Any) -> None:
        if v.__class__ is not dict:
            return
        ref = v.get("reference")
        ident = v.get("identifier")
        isys = ival = None
        if ident.__class__ is dict:
            isys = ident.get("system")
            ival = ident.get("value")
        if ref.__class__ is str and ref and ref[0] != "#":
            t, i = refs[ref]
            out.append((code, t, i, ref, isys, ival))
        elif isys is not None or ival is not None:
            out.append((code, None, None, None, isys, ival))

    def r_inline(v: Any, out: list, code: Any) -> None:
        if v.__class__ is dict:
            rt = v.get("resourceType")
            rid = v.get("id")
            if rt in known and rid.__class__ is str:
                out.append((code, rt, rid, None, None, None))

    return r_reference, r_inline


def r_uri(v: Any, out: list, code: Any) -> None:
    if v.__class__ is str and v:
        out.append((code, None, None, v, None, None))
