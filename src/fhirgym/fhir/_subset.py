"""``_summary`` and ``_elements``: a resource cut down to what the client asked for, marked SUBSETTED.

Reads, vreads and search entries shape their resources the same way, through :func:`subset`.
"""

from __future__ import annotations

from collections.abc import Collection

from ..spec import ElementDef, Spec
from ._http import Request, Response
from ._search import element_names, summary_mode

_SUBSETTED = {"system": "http://terminology.hl7.org/CodeSystem/v3-ObservationValue", "code": "SUBSETTED"}


def shaped(spec: Spec, req: Request, resp: Response) -> Response:
    """A read's resource as ``_summary`` / ``_elements`` ask (marked SUBSETTED), like a search's entries."""
    summary = elements = None
    for key, value in req.query:
        if key == "_summary":
            summary = summary_mode(value, ("true", "false", "text", "data"))
        elif key == "_elements":
            elements = element_names(value)
    if summary is not None or elements is not None:
        resp.body = subset(spec, resp.body, summary, elements)
    return resp


def subset(spec: Spec, body: dict, summary: str | None, elements: Collection[str] | None) -> dict:
    """``body`` cut down to a ``_summary`` mode or the ``_elements`` named (a set, for a page of them)."""
    if summary in (None, "false") and not elements:
        return body
    rtype = body["resourceType"]
    keep_always = {"resourceType", "id", "meta"}
    if summary == "text":
        kept = {k: v for k, v in body.items() if k in keep_always or k == "text" or _mandatory(spec, rtype, k)}
    elif summary == "data":
        kept = {k: v for k, v in body.items() if k != "text"}
    elif summary == "true":
        kept = {k: v for k, v in body.items() if k in keep_always or _is_summary(spec, rtype, k)}
    else:
        wanted = elements if isinstance(elements, set | frozenset) else set(elements or ())
        # mandatory elements are kept too, as the specification asks (the result stays valid)
        kept = {
            k: v for k, v in body.items()
            if k in keep_always or k in wanted or _choice_name(spec, rtype, k) in wanted or _mandatory(spec, rtype, k)
        }
    meta = dict(kept.get("meta") or {})
    meta["tag"] = [*meta.get("tag", []), _SUBSETTED]
    kept["meta"] = meta
    return kept


def _choice_name(spec: Spec, rtype: str, key: str) -> str:
    """``valueQuantity`` → ``value`` for choice elements; other keys unchanged."""
    for name, el in spec.child_elements(rtype).items():
        if el.is_choice and key.startswith(name) and key[len(name):][:1].isupper():
            return name
    return key


def _element_def(spec: Spec, rtype: str, key: str) -> ElementDef | None:
    children = spec.child_elements(rtype)
    return children.get(key) or children.get(_choice_name(spec, rtype, key))


def _is_summary(spec: Spec, rtype: str, key: str) -> bool:
    el = _element_def(spec, rtype, key)
    return bool(el and (el.is_summary or el.is_modifier or el.min > 0))


def _mandatory(spec: Spec, rtype: str, key: str) -> bool:
    el = _element_def(spec, rtype, key)
    return bool(el and el.min > 0)
