"""Proof of the validators: the reference solution must pass every instance, doing nothing must fail it.

``check(...)`` runs, for every family × seed, the reference solution (strict and light must pass, it
must follow one of the family's gold tool sequences, touch its required types and use no prohibited
tool) and the null agent (must fail strict and light), and, for writing families, the mutations of
:mod:`._mutate` (each applied one must fail strict; at least three must apply). ``fhirgym tasks check``
prints the result and exits non-zero on any violation.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ._failure import failure_modes_of
from ._family import Family, Instance, TaskWorld, make_instance
from ._mutate import MUTATIONS, run_mutation

MIN_MUTATIONS = 3
#: The near-misses issue 4 names: a wrong target entity, a missing or wrong field, an extra unrelated write.
REQUIRED_MUTATIONS = (("wrong_target",), ("drop_field", "wrong_value"), ("extra_write",))


@dataclass
class CheckRow:
    task_id: str
    seed: int
    reference_strict: bool
    reference_light: bool | None
    null_strict: bool
    null_light: bool | None
    mutations_applied: int = 0
    mutations_rejected: int = 0
    problems: list[str] = field(default_factory=list)
    ms: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def check_instance(inst: Instance, mutations: bool = True) -> CheckRow:
    fam = inst.family
    t0 = time.perf_counter()
    run = inst.reference
    ref, calls = run.verdict, run.calls
    with inst.open() as ep:
        null = ep.finish(None)
    row = CheckRow(fam.id, inst.seed, ref.success, ref.light_success, null.success, null.light_success)
    if not ref.success:
        row.problems.append("reference fails: " + "; ".join(ref.reasons))
    if fam.writes and not ref.light_success:
        row.problems.append("reference fails the light validator")
    modes = [m for m in failure_modes_of(fam, calls, False) if m != "other"]
    if modes:
        row.problems.append(f"reference has failure modes {modes} (calls: {[c.name for c in calls]})")
    if null.success:
        row.problems.append("null agent passes strict")
    if null.light_success:
        row.problems.append("null agent passes light")
    if mutations and fam.writes:
        applied = set()
        for name in MUTATIONS:
            out = run_mutation(inst, name)
            if not out.applied:
                continue
            applied.add(name)
            row.mutations_applied += 1
            if out.rejected:
                row.mutations_rejected += 1
            else:
                row.problems.append(f"mutation {name} passes strict validation")
        for kinds in REQUIRED_MUTATIONS:
            if not applied & set(kinds):
                row.problems.append(f"no {' or '.join(kinds)} mutation applies")
        if row.mutations_applied < MIN_MUTATIONS:
            row.problems.append(f"only {row.mutations_applied} mutations apply (need {MIN_MUTATIONS})")
    row.ms = (time.perf_counter() - t0) * 1000
    return row


def check(fams: Iterable[Family], seeds: Iterable[int], world: TaskWorld, mutations: bool = True,
          progress=None) -> list[CheckRow]:
    rows = []
    for fam in fams:
        for seed in seeds:
            try:
                inst = make_instance(fam, seed, world)
                row = check_instance(inst, mutations=mutations)
            except Exception as exc:  # a broken family is a finding, not a crash of the whole check
                row = CheckRow(fam.id, seed, False, None, False, None,
                               problems=[f"error: {type(exc).__name__}: {exc}"])
            rows.append(row)
            if progress:
                progress(row)
    return rows
