"""A small demo world for ``fhirgym serve --demo``: a few seeded Synthea patients as a base file.

Built once per (seed, patients, reference date) and cached; the full world generator (practitioners,
schedules, slots, coverage, genetics) is its own feature and will replace this as the default world.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from ..fhir import FhirServer, InProcessClient, ServerConfig, Store
from ..spec import cache_dir
from ._synthea import synthea_bundles

DEMO_VERSION = 1


def demo_world(seed: int = 42, patients: int = 5, reference_date: str = "20250101") -> Path:
    """Path of the cached demo base file, building it if needed (Synthea bundles loaded as transactions)."""
    path = cache_dir() / "worlds" / f"demo-v{DEMO_VERSION}-s{seed}-p{patients}-r{reference_date}.db"
    if path.is_file():
        return path
    store = Store()
    anchor = datetime.strptime(reference_date, "%Y%m%d").replace(tzinfo=UTC)
    server = FhirServer(store, config=ServerConfig(id_seed=seed, clock=lambda: anchor))
    client = InProcessClient(server)
    for bundle in synthea_bundles(seed, patients, reference_date):
        resp = client.transaction(bundle)
        if resp.status != 200:
            raise RuntimeError(f"demo world: a Synthea bundle was rejected: {resp.body}")
    store.export(path)
    store.close()
    return path
