"""Synthetic clinical worlds: generation (seeded, reproducible) and loading into the server's store."""

from ._demo import demo_world
from ._synthea import bundle_resources, repair_bundle, synthea_bundles

__all__ = ["bundle_resources", "demo_world", "repair_bundle", "synthea_bundles"]
