"""What more than one of the billing modules uses: world facts, phrasing, checks and reference steps."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date

from ....spec.codes import ROLE_CODE
from ....tools import Toolbox
from ... import View
from ...checks import Check, coded, eq, ref
from ...facts import (
    accounts,
    living_patients,
    unique_patient,
)
from ...solve import call, find_patient

#: v3-RoleCode relationship -> (word, gender)
RELATION = {"MTH": ("mother", "female"), "FTH": ("father", "male"), "SPS": ("spouse", "")}


def _code(concept: object) -> str | None:
    if isinstance(concept, list):
        concept = concept[0] if concept else {}
    return next((c.get("code") for c in (concept or {}).get("coding", [])), None) if isinstance(concept, dict) else None


def candidates(view: View, key: str, fits: Callable[[View, dict], bool]) -> list[dict]:
    """Living patients for which ``fits(view, patient)`` holds, cached per world under ``billing.<key>``."""
    return view.cached(f"billing.{key}", lambda: [p for p in living_patients(view) if fits(view, p)])


def _active(coverages: list[dict]) -> list[dict]:
    return [c for c in coverages if c.get("status") == "active"]


def _age(birth: str, on: date) -> int:
    b = date.fromisoformat(birth)
    return on.year - b.year - ((on.month, on.day) < (b.month, b.day))


def _only_account(view: View, p: dict) -> dict | None:
    held = accounts(view).get(p["id"], [])
    return held[0] if len(held) == 1 else None


def _account_holders(view: View) -> list[dict]:
    """Living patients with exactly one Account."""
    return candidates(view, "one_account", lambda v, p: _only_account(v, p) is not None)


def _gold_account(view: View, params: dict) -> dict:
    pid = unique_patient(view, params["name"], params["birth_date"])["id"]
    held = accounts(view).get(pid, [])
    assert len(held) == 1, f"{params}: {len(held)} accounts"
    return held[0]


def _find_account(tools: Toolbox, params: dict) -> dict | None:
    patient = find_patient(tools, params["name"], params["birth_date"])
    if patient is None:
        return None
    out = call(tools, "searchResources", {"resourceType": "Account", "params": {
        "subject": f"Patient/{patient['id']}"}})
    accounts = out.get("resources", [])
    return accounts[0] if accounts else None


def _related_word(rp: dict) -> str:
    code = _code(rp.get("relationship"))
    return RELATION.get(code or "", ("related person", ""))[0]


def _related_person(patient: str, params: dict) -> tuple[Check, ...]:
    """The checks of a RelatedPerson the request describes: whose relative, how related, name, gender, birth."""
    return (ref("patient", patient), coded("relationship", ROLE_CODE, params["rel_code"]),
            eq("name.family", params["rp_family"]), eq("name.given", params["rp_given"]),
            eq("gender", params["rp_gender"]), eq("birthDate", params["rp_birth"]))
