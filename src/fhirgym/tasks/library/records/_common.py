"""What more than one of the records modules uses: world facts, phrasing, checks and reference steps."""

from __future__ import annotations

from ...facts import (
    full_name,
)


def _person_params(p: dict) -> dict:
    return {"patient_id": p["id"], "name": full_name(p), "birth_date": p["birthDate"], "gender": p.get("gender")}


def _status(resource: dict, element: str) -> str | None:
    return next((x.get("code") for x in (resource.get(element) or {}).get("coding", [])), None)


def _plain(display: str) -> str:
    """'Essential hypertension (disorder)' -> 'essential hypertension' (proper nouns keep their capital)."""
    text = display.rsplit(" (", 1)[0] if display.endswith(")") else display
    first = text.split(" ", 1)[0]
    return text if "'" in first or first[1:2].isupper() else text[:1].lower() + text[1:]
