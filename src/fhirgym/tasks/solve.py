"""The reference solutions' client: the agents' own tools, with less ceremony.

A reference solution works only through a :class:`~fhirgym.tools.Toolbox` (the tools agents get), from
what the prompt says; these are the steps every family's ``solve`` repeats. Its final text is always
:func:`~fhirgym.tasks.answer_text` (one answer renderer).
"""

from __future__ import annotations

from ..tools import Toolbox
from .facts import full_name


def call(tools: Toolbox, name: str, args: dict) -> dict:
    """One tool call's output ({} when it failed: the reference then finds nothing)."""
    out = tools.call(name, args).output
    return out if isinstance(out, dict) else {}


def search(tools: Toolbox, rtype: str, params: dict) -> list[dict]:
    """The first page of a search."""
    return call(tools, "searchResources", {"resourceType": rtype, "params": params}).get("resources", [])


def search_all(tools: Toolbox, rtype: str, params: dict, all_pages: bool = True) -> list[dict]:
    """Page by page (each page must fit the tool's output budget: a reference never reads a truncated page)."""
    out = tools.call("searchResources", {"resourceType": rtype, "params": params}).output
    found = list(out.get("resources", []))
    while True:
        assert not out.get("omitted"), f"reference search {rtype}?{params} overflows the output budget"
        if not (all_pages and out.get("next_page_url")):
            return found
        out = tools.call("searchResources", {"resourceType": rtype, "page_url": out["next_page_url"]}).output
        found += out.get("resources", [])


def read(tools: Toolbox, rtype: str, rid: str) -> dict:
    return call(tools, "getResourceById", {"resourceType": rtype, "resourceId": rid})


def create(tools: Toolbox, body: dict) -> None:
    tools.call("createResource", {"resourceType": body["resourceType"], "body": body})


def update(tools: Toolbox, resource: dict) -> None:
    tools.call("updateResource", {"resourceType": resource["resourceType"], "resourceId": resource["id"],
                                  "body": resource})


def find_patients(tools: Toolbox, name: str, birth_date: str) -> list[dict]:
    """Patients searched by given, family and birth date, the full name ("Given Family") confirmed."""
    given, family = name.split()[0], name.split()[-1]
    found = search(tools, "Patient", {"given": given, "family": family, "birthdate": birth_date})
    return [p for p in found if full_name(p) == name]


def find_patient(tools: Toolbox, name: str, birth_date: str) -> dict | None:
    """The one patient :func:`find_patients` names, else None."""
    found = find_patients(tools, name, birth_date)
    return found[0] if len(found) == 1 else None
