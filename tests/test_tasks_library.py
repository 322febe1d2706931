"""Proof of every validator in the library (issue 4 req 6), in small form: the reference solution passes
every instance strictly and lightly, the null agent fails all, and on writing families at least three
mutated references are applied and rejected. `fhirgym tasks check --seeds 20` is the full form."""

from __future__ import annotations

import pytest

from fhirgym.tasks import CATEGORIES, TaskWorld, families
from fhirgym.tasks._check import check

SEEDS = range(3)


def test_the_library_is_big_enough_and_writes_enough():
    fams = families()
    assert len(fams) >= 60, len(fams)
    assert sum(f.writes for f in fams) / len(fams) >= 0.4
    assert {f.category for f in fams} == set(CATEGORIES)
    for f in fams:
        assert f.title and f.sequences and f.resource_types, f.id
        assert f.writes or set(f.prohibited_tools) >= {"createResource", "updateResource", "deleteResource"}, f.id


@pytest.mark.parametrize("family", [f.id for f in families()])
def test_reference_passes_null_fails_mutations_rejected(family, small_world_path):
    [*rows] = check([f for f in families() if f.id == family], SEEDS, TaskWorld.open(small_world_path))
    problems = [f"seed {r.seed}: {p}" for r in rows for p in r.problems]
    assert not problems, "\n".join(problems)
    assert all(r.reference_strict and not r.null_strict for r in rows)
