"""Family versions held to what the families do: a digest of each family's behaviour against a record.

A result line carries its family's ``version``; two results are comparable only if that version says the
family did not change between them. The digest covers what decides a verdict (the header, and per seed
the instance's bytes and every verdict ``tasks check`` computes), so a change that moves any of them
without a version bump is caught by comparing against a recorded table (``scripts/family_versions.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import asdict

import orjson

from ._check import check_instance, instance_bytes
from ._family import Family, TaskWorld, make_instance

#: The header attributes that decide a verdict (the version itself is what the digest is checked against).
HEADER = ("id", "category", "difficulty", "writes", "resource_types", "sequences", "read_resource_types",
          "read_sequences", "prohibited_tools", "negative_evidence", "title")


def family_digest(fam: Family, seeds: Iterable[int], world: TaskWorld) -> str:
    """sha256 of the family's header and answer spec, and per seed of its instance and its check row."""
    digest = hashlib.sha256(orjson.dumps({k: getattr(fam, k) for k in HEADER}, option=orjson.OPT_SORT_KEYS))
    digest.update(repr(fam.answer).encode())
    for seed in seeds:
        inst = make_instance(fam, seed, world)
        row = {k: v for k, v in asdict(check_instance(inst)).items() if k != "ms"}
        digest.update(instance_bytes(inst))
        digest.update(orjson.dumps(row, option=orjson.OPT_SORT_KEYS))
    return digest.hexdigest()


def family_record(fams: Iterable[Family], seeds: Iterable[int], world: TaskWorld, world_sha256: str) -> dict:
    """The table a record file holds: every family's version and digest, on a named world and seeds."""
    seeds = list(seeds)
    return {"world_sha256": world_sha256, "seeds": seeds,
            "families": {f.id: {"version": f.version, "digest": family_digest(f, seeds, world)} for f in fams}}


def version_problems(recorded: dict, current: dict) -> tuple[list[str], list[str]]:
    """(families changed without a version bump, entries merely out of date) between two records. The
    first kind must be fixed in the family (bump ``version``, say what changed in CHANGELOG.md); the
    second by recording again."""
    if (recorded.get("world_sha256"), recorded.get("seeds")) != (current["world_sha256"], current["seeds"]):
        return [], ["the record was made on another world or other seeds"]
    old, new = recorded.get("families", {}), current["families"]
    unbumped, stale = [], []
    for task_id, now in new.items():
        was = old.get(task_id)
        if was is None:
            stale.append(f"{task_id}: not recorded yet")
        elif now["version"] < was["version"]:
            unbumped.append(f"{task_id}: version {now['version']} is below the recorded {was['version']}")
        elif now["digest"] != was["digest"] and now["version"] == was["version"]:
            unbumped.append(f"{task_id}: changed without a version bump (still version {now['version']})")
        elif now != was:
            stale.append(f"{task_id}: version {was['version']} -> {now['version']}, not recorded yet")
    stale += [f"{task_id}: recorded but no longer registered" for task_id in old if task_id not in new]
    return unbumped, stale
