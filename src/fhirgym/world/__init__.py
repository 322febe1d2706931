"""Synthetic clinical worlds: seeded, reproducible generation, validation, caching and import.

A world is an immutable SQLite base file for the embedded server (open isolated stores on it with
``info.snapshot().open()``), built from Synthea records plus our administrative, scheduling, billing
and genetics generators.
"""

from ._admin import EMPLOYERS, INSURERS
from ._build import (
    DEFAULT_ANCHOR,
    DEFAULT_PATIENTS,
    DEFAULT_SEED,
    GENERATOR_VERSION,
    META_KEY,
    ValidationReport,
    WorldBuildError,
    WorldInfo,
    build_world,
    check_world,
    flatten_bundles,
    import_world,
    world_file,
    world_info,
    world_sha256,
)
from ._context import WorldContext
from ._genetics import INDICATIONS, SURGERIES
from ._synthea import repair_bundle, synthea_bundles

__all__ = [
    "DEFAULT_ANCHOR",
    "DEFAULT_PATIENTS",
    "DEFAULT_SEED",
    "EMPLOYERS",
    "GENERATOR_VERSION",
    "INDICATIONS",
    "INSURERS",
    "META_KEY",
    "SURGERIES",
    "ValidationReport",
    "WorldBuildError",
    "WorldContext",
    "WorldInfo",
    "build_world",
    "check_world",
    "flatten_bundles",
    "import_world",
    "repair_bundle",
    "synthea_bundles",
    "world_file",
    "world_info",
    "world_sha256",
]
