"""Record every family's version and behaviour digest in tests/data/family_versions.json (``--check``:
exit 1 on any difference; the tests run it).

Recording refuses a family whose digest changed while its version did not: bump ``version`` in the
family and say what changed under a "not comparable" entry in CHANGELOG.md, then record again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fhirgym._defaults import DEFAULT_PATIENTS, DEFAULT_SEED
from fhirgym.tasks import TaskWorld, families
from fhirgym.tasks._versions import family_record, version_problems
from fhirgym.world import build_world, world_sha256

RECORD = Path(__file__).resolve().parents[1] / "tests" / "data" / "family_versions.json"
SEEDS = range(3)


def main() -> None:
    path = build_world(seed=DEFAULT_SEED, patients=DEFAULT_PATIENTS).path
    current = family_record(families(), SEEDS, TaskWorld.open(path), world_sha256(path))
    recorded = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
    unbumped, stale = version_problems(recorded, current)
    for line in unbumped:
        print(f"changed without a version bump: {line}", file=sys.stderr)
    if "--check" in sys.argv[1:]:
        for line in stale:
            print(f"out of date: {line} (run python scripts/family_versions.py)", file=sys.stderr)
        sys.exit(1 if unbumped or stale else 0)
    if unbumped:
        sys.exit("not recorded: bump those families' version (and add a CHANGELOG entry) first")
    RECORD.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    before = recorded.get("families", {})
    moved = sum(before.get(k) != v for k, v in current["families"].items())
    print(f"{RECORD}: {len(current['families'])} families, {moved} recorded anew")


if __name__ == "__main__":
    main()
