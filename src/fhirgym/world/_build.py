"""Building a world: Synthea clinical records + our generators → one validated, immutable base file.

A world is a SQLite base file (see :mod:`fhirgym.fhir`) with a manifest in its ``meta`` table: seed,
size, anchor date, generator version, counts per type and a content hash. The same arguments give a
byte-identical file: Synthea runs with the seed and the anchor as its reference date, every other
random choice comes from the seed (:class:`WorldContext`), ids are deterministic, and the store's
clock is frozen at the anchor. Builds are cached by (seed, size, anchor, generator version).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path

import orjson

from .._defaults import DEFAULT_PATIENTS, DEFAULT_SEED
from .._gc import gc_paused
from ..fhir import (
    FhirError,
    FhirServer,
    Issue,
    ServerConfig,
    Snapshot,
    Store,
    dumps_json,
    loads_json,
    rewrite_references,
)
from ..spec import cache_dir, file_sha256, load_spec
from ._context import WorldContext
from ._synthea import repair_bundle, synthea_bundles

#: Bump whenever any generator's output changes: cached worlds of older versions are not reused.
GENERATOR_VERSION = 7
DEFAULT_ANCHOR = date(2025, 6, 2)  # a Monday
#: Synthea resource types not kept in a world: billing artefacts no task uses (a fifth of the data and
#: of the build time), and Synthea's lifelong Coverages, which only those artefacts refer to; the
#: admin generator writes coverage that insurance tasks can rely on (incl. uninsured patients).
DROPPED_TYPES = frozenset({"Claim", "ExplanationOfBenefit", "Provenance", "Coverage"})
META_KEY = "fhirgym.world"


class WorldBuildError(RuntimeError):
    """The generated data did not pass validation; the report says exactly what failed."""

    def __init__(self, report: ValidationReport) -> None:
        super().__init__(report.summary())
        self.report = report


@dataclass
class ValidationReport:
    """What the server's own validation says about a set of resources before they become a world."""

    checked: int = 0
    invalid: list[tuple[str, list[Issue]]] = field(default_factory=list)  # ("Type/id", issues)
    dangling: list[Issue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.invalid and not self.dangling

    def summary(self, limit: int = 10) -> str:
        lines = [f"validated {self.checked} resources: {len(self.invalid)} invalid, "
                 f"{len(self.dangling)} dangling references"]
        for key, issues in self.invalid[:limit]:
            lines.append(f"  {key}: " + "; ".join(f"{i.diagnostics} ({', '.join(i.expression)})" for i in issues[:3]))
        lines.extend(f"  {d.diagnostics}" for d in self.dangling[:limit])
        return "\n".join(lines)


@dataclass
class WorldInfo:
    path: Path
    seed: int | None
    patients: int | None
    anchor: str | None
    generator_version: int | None
    counts: dict[str, int]
    build_seconds: float | None = None
    cached: bool = False
    timings: dict[str, float] = field(default_factory=dict)  # seconds per build stage

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def sha256(self) -> str:
        """The world file's sha256, computed when first asked (see :func:`world_sha256`)."""
        return world_sha256(self.path)

    def snapshot(self) -> Snapshot:
        return Snapshot(self.path)


def world_sha256(path: str | Path) -> str:
    """sha256 of a world file, remembered in ``<file>.sha256`` next to it.

    Hashing a 100-patient world (1.2 GB) takes 6 s on a 2-core machine, and every eval records it: the
    digest is computed once per file version (size, mtime, inode) and read back afterwards. Where the
    side file cannot be written (a read-only folder), it is simply computed each time.
    """
    path = Path(path)
    st = path.stat()
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    side = path.with_name(path.name + ".sha256")
    with contextlib.suppress(OSError, ValueError, KeyError):
        known = orjson.loads(side.read_bytes())
        if known["stamp"] == stamp:
            return known["sha256"]
    digest = file_sha256(path)
    with contextlib.suppress(OSError):
        partial = side.with_name(side.name + f".{os.getpid()}.part")
        partial.write_bytes(orjson.dumps({"stamp": stamp, "sha256": digest}))
        partial.replace(side)
    return digest


def _prepare_spec() -> None:
    with contextlib.suppress(Exception):
        load_spec()


def _anchor(value: date | str) -> date:
    return value if isinstance(value, date) else date.fromisoformat(value)


def cache_path(seed: int, patients: int, anchor: date) -> Path:
    return cache_dir() / "worlds" / f"world-v{GENERATOR_VERSION}-s{seed}-p{patients}-a{anchor.isoformat()}.db"


def flatten_bundles(bundles: list[dict], skip: frozenset[str] = frozenset(), copy: bool = True) -> list[dict]:
    """Resources of transaction/collection Bundles with ``urn:uuid`` references turned into ``Type/id``.

    Resources keep their ids (Synthea's are seeded); a resource repeated across bundles (shared
    organisations, practitioners) is kept once. Types in ``skip`` are left out (references to them are
    rewritten all the same). ``copy=False`` rewrites the bundles' own resources, for callers that
    discard the bundles (a copy of a 100-patient world's resources costs seconds).
    """
    mapping: dict[str, str] = {}
    for b in bundles:
        for e in b.get("entry", []):
            r = e.get("resource") or {}
            if e.get("fullUrl") and r.get("id"):
                mapping[e["fullUrl"]] = f"{r['resourceType']}/{r['id']}"
    seen: set[tuple[str, str]] = set()
    out = []
    for b in bundles:
        for e in b.get("entry", []):
            r = e.get("resource")
            if not isinstance(r, dict) or r.get("resourceType") in skip:
                continue
            key = (r.get("resourceType"), r.get("id"))
            if key[1] is not None:
                if key in seen:
                    continue
                seen.add(key)
            if copy:
                r = loads_json(dumps_json(r))
            rewrite_references(r, mapping.get)
            out.append(r)
    return out


def validate_resources(server: FhirServer, resources: list[dict]) -> ValidationReport:
    """Validate everything (not fail-fast), so one build or import reports every problem at once."""
    report = ValidationReport(checked=len(resources))
    for r in resources:
        issues = [i for i in server.validator.validate(r) if i.severity in ("error", "fatal")]
        if issues:
            report.invalid.append((f"{r.get('resourceType')}/{r.get('id')}", issues))
    return report


def check_world(path: str | Path) -> ValidationReport:
    """Validate every live resource of a world file as a write would, invariants included: a world must
    obey the rules its agents' writes are checked by."""
    store = Store(base=Path(path))
    try:
        server = FhirServer(store)
        report = ValidationReport()
        for rtype, rid, data in store.iter_current():
            report.checked += 1
            issues = [i for i in server.validator.validate(loads_json(data)) if i.severity in ("error", "fatal")]
            if issues:
                report.invalid.append((f"{rtype}/{rid}", issues))
        return report
    finally:
        store.close()


def generate_resources(seed: int, patients: int, anchor: date, timings: dict[str, float] | None = None
                       ) -> list[dict]:
    """All resources of a world, in a deterministic order (Synthea first, then each generator)."""
    from ._admin import generate as generate_admin
    from ._clinical import generate as generate_clinical
    from ._genetics import generate as generate_genetics

    timings = timings if timings is not None else {}
    t = time.perf_counter()
    bundles = synthea_bundles(seed, patients, anchor.strftime("%Y%m%d"))
    clinical = flatten_bundles(bundles, skip=DROPPED_TYPES, copy=False)
    timings["synthea"] = time.perf_counter() - t
    t = time.perf_counter()
    ctx = WorldContext(seed=seed, anchor=anchor)
    ctx.add(clinical)
    for generate in (generate_clinical, generate_admin, generate_genetics):
        ctx.add(generate(ctx))
    timings["generators"] = time.perf_counter() - t
    return ctx.resources


def store_world(resources: list[dict], path: Path, manifest: dict, workers: int = 2,
                anchor: date | None = None, timings: dict[str, float] | None = None) -> ValidationReport:
    """Validate and load resources into a new base file at ``path`` (nothing written if invalid).

    The store is built in a scratch file next to ``path`` (not memory: in-memory SQLite databases stop
    at 1 GiB, a 100-patient world is larger) that becomes the world file once complete.
    """
    frozen = datetime.combine(anchor or DEFAULT_ANCHOR, datetime.min.time(), tzinfo=UTC)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fhirgym-build-", dir=path.parent) as tmp:
        store = Store(path=Path(tmp) / "build.db", durable=False)
        try:
            return _store_world(store, resources, path, manifest, workers, frozen, timings)
        finally:
            store.close()


def _store_world(store: Store, resources: list[dict], path: Path, manifest: dict, workers: int,
                 frozen: datetime, timings: dict[str, float] | None) -> ValidationReport:
    server = FhirServer(store, config=ServerConfig(id_seed=manifest.get("seed") or 0, clock=lambda: frozen))
    timings = timings if timings is not None else {}
    t = time.perf_counter()
    try:
        # validated once, in the load's worker processes (in parallel, next to the indexing)
        dangling = server.load(resources, validate=True, workers=workers)
    except FhirError:  # the load stops at the first invalid resource: report them all
        report = validate_resources(server, resources)
        timings["validate"] = time.perf_counter() - t
        if report.ok:
            raise  # not a validation error (a missing type or a malformed id): nothing to report on
        return report
    timings["validate+index+load"] = time.perf_counter() - t
    report = ValidationReport(checked=len(resources), dangling=dangling)
    if report.dangling:
        return report
    manifest = {**manifest, "counts": store.counts()}
    store.set_meta(META_KEY, orjson.dumps(manifest, option=orjson.OPT_SORT_KEYS).decode())
    t = time.perf_counter()
    store.finish(path)
    timings["finish"] = time.perf_counter() - t
    return report


def world_file(path: str | Path | None = None, *, seed: int = DEFAULT_SEED, patients: int = DEFAULT_PATIENTS,
               announce: Callable[[str], None] | None = None) -> Path:
    """The world a command, a dataset row or a task works on: ``path`` if given (it must be a file), else
    the cached seeded world of ``seed`` and ``patients``, built on first use (``announce`` hears that
    first). Every default world in fhirgym comes from here."""
    if path is not None:
        found = Path(path).expanduser()
        if not found.is_file():
            raise ValueError(f"world file {str(path)!r} does not exist")
        return found.resolve()
    if announce is not None:
        announce(f"world: seed {seed}, {patients} patients (built once, then cached) ...")
    return build_world(seed=seed, patients=patients).path


def build_world(seed: int = DEFAULT_SEED, patients: int = DEFAULT_PATIENTS, anchor_date: date | str = DEFAULT_ANCHOR,
                out: str | Path | None = None, use_cache: bool = True, workers: int = 2) -> WorldInfo:
    """Build (or fetch from the cache) the world for these arguments; copy it to ``out`` if given."""
    anchor = _anchor(anchor_date)
    cached = cache_path(seed, patients, anchor)
    t0 = time.perf_counter()
    was_cached = use_cache and cached.is_file()
    timings: dict[str, float] = {}
    if not was_cached:
        # the spec (downloaded and parsed on a fresh machine: seconds) is made ready while Synthea runs;
        # a failure there is raised once, clearly, where the load needs the spec (not also in the thread)
        spec = threading.Thread(target=_prepare_spec, daemon=True)
        spec.start()
        with gc_paused():
            resources = generate_resources(seed, patients, anchor, timings)
            spec.join()
            manifest = {"seed": seed, "patients": patients, "anchor": anchor.isoformat(),
                        "generator_version": GENERATOR_VERSION}
            report = store_world(resources, cached, manifest, workers, anchor, timings)
            del resources
        if not report.ok:
            raise WorldBuildError(report)
    target = cached
    if out is not None:
        target = Path(out)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.resolve() != cached.resolve():
            shutil.copyfile(cached, target)
    info = world_info(target)
    info.build_seconds = time.perf_counter() - t0
    info.cached = was_cached
    info.timings = timings
    return info


def world_info(path: str | Path) -> WorldInfo:
    """Manifest and live counts of a world (or any base file)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no world file at {path}")
    store = Store(base=path)
    try:
        raw = store.get_meta(META_KEY)
        counts = store.counts()
    finally:
        store.close()
    manifest = orjson.loads(raw) if raw else {}
    return WorldInfo(path, manifest.get("seed"), manifest.get("patients"), manifest.get("anchor"),
                     manifest.get("generator_version"), counts)


def import_world(paths: list[str | Path], out: str | Path, workers: int = 2) -> tuple[WorldInfo | None, ValidationReport]:
    """A world from FHIR Bundles (``.json``) or NDJSON files; invalid input is reported, not stored.

    Synthea's one known R4 violation is repaired first (:func:`repair_bundle`); anything else invalid
    or dangling fails the import with the full report.
    """
    with gc_paused():
        return _import_world([Path(p) for p in paths], Path(out), workers)


def _import_world(paths: list[Path], out: Path, workers: int) -> tuple[WorldInfo | None, ValidationReport]:
    bundles: list[dict] = []
    loose: list[dict] = []
    for p in paths:
        files = sorted(p.rglob("*")) if p.is_dir() else [p]
        for f in files:
            if f.suffix == ".ndjson":
                loose.extend(loads_json(line) for line in f.read_bytes().splitlines() if line.strip())
            elif f.suffix == ".json":
                data = loads_json(f.read_bytes())  # decimals as written
                if data.get("resourceType") == "Bundle":
                    bundles.append(repair_bundle(data))
                else:
                    loose.append(data)
    resources = flatten_bundles([*bundles, {"entry": [{"resource": r} for r in loose]}])
    counts = Counter(r.get("resourceType") for r in resources)
    manifest = {"imported_from": [str(p) for p in paths], "generator_version": GENERATOR_VERSION,
                "input_counts": dict(sorted(counts.items()))}
    report = store_world(resources, out, manifest, workers)
    if not report.ok:
        return None, report
    return world_info(out), report
