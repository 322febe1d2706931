"""Proof of the validators: the reference solution must pass every instance, doing nothing must fail it.

``check(...)`` runs, for every family × seed, the reference solution (strict and light must pass, it
must follow one of the family's gold tool sequences, touch its required types and use no prohibited
tool), the null agent (must fail strict and light), the wrong mutations of :mod:`._mutate` (each applied
one must fail strict; on writing families at least three must apply) and its equivalent rewrites (each
applied one must pass strict). ``fhirgym tasks check`` prints the result and exits non-zero on any
violation.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

from ._answer import NOT_FOUND, answer_text, render
from ._failure import failure_modes_of
from ._family import Family, Instance, TaskWorld, View, families, make_instance
from ._mutate import EQUIVALENTS, MUTATIONS, run_mutation, variants

MIN_MUTATIONS = 3
#: The near-misses every family must reject: a wrong target entity, a missing or wrong field, an extra unrelated write.
REQUIRED_MUTATIONS = (("wrong_target",), ("drop_field", "wrong_value"), ("extra_write",))
#: Each kind of answer of a family that offers "nothing found" occurs on at least this share of seeds,
NEGATIVE_MIN = 0.3
#: the constant "nothing found" reply passes at most this share of the library,
CONSTANT_MAX = 0.05
#: no gold value (but "nothing found") is the gold of more than this share of a family's seeds,
GOLD_MAX = 0.25
#: and where a family plants distractors, the first hit of a plain search is one in at least this share.
DISTRACTOR_MIN = 0.5
#: The constant agent's reply: the structured "nothing found" answer, after no tool call at all.
NOTHING_FOUND_REPLY = answer_text(NOT_FOUND)


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
    equivalents_applied: int = 0
    equivalents_passed: int = 0
    outcomes: dict[str, bool] = field(default_factory=dict)  # applied mutation -> the validator got it right
    coded_applied: int = 0  # runs of add_wrong_code (two per coded element the gold checks)
    coded_rejected: int = 0
    nothing_found_passes: bool = False  # the constant "nothing found" reply passes strict
    negative: bool = False  # the gold answer is "nothing found"
    gold_key: str = ""  # the gold (answer and expected changes) as one comparable string
    first_hit_distractor: bool | None = None  # Family.distractor_probe on the pre-run state
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
    survey(inst, row)
    if not ref.success:
        row.problems.append("reference fails: " + "; ".join(ref.reasons))
    if inst.writes and not ref.light_success:
        row.problems.append("reference fails the light validator")
    modes = [m for m in failure_modes_of(inst, calls, False) if m != "other"]
    if modes:
        row.problems.append(f"reference has failure modes {modes} (calls: {[c.name for c in calls]})")
    if null.success:
        row.problems.append("null agent passes strict")
    if null.light_success:
        row.problems.append("null agent passes light")
    if mutations:
        _mutate(inst, row)
    row.ms = (time.perf_counter() - t0) * 1000
    return row


def _mutate(inst: Instance, row: CheckRow) -> None:
    """Every wrong mutation that applies must fail strict, every equivalent one must pass it."""
    for name in EQUIVALENTS:
        out = run_mutation(inst, name)
        if out.applied:
            row.equivalents_applied += 1
            row.outcomes[name] = out.verdict is not None and out.verdict.success
            if row.outcomes[name]:
                row.equivalents_passed += 1
            else:
                why = "; ".join(out.verdict.reasons) if out.verdict else "no verdict"
                row.problems.append(f"equivalent {name} fails strict validation: {why}")
    applied = set()
    for name in MUTATIONS:
        for variant in range(variants(inst, name)):
            out = run_mutation(inst, name, variant)
            if not out.applied:
                continue
            applied.add(name)
            row.mutations_applied += 1
            row.outcomes[name] = row.outcomes.get(name, True) and out.rejected
            if name == "add_wrong_code":
                row.coded_applied += 1
                row.coded_rejected += out.rejected
            if out.rejected:
                row.mutations_rejected += 1
            else:
                row.problems.append(f"mutation {name}{f' (run {variant})' if variant else ''} passes strict "
                                    f"validation: {out.verdict.reasons if out.verdict else ''}")
    if not inst.writes:
        return
    for kinds in REQUIRED_MUTATIONS:
        if not applied & set(kinds):
            row.problems.append(f"no {' or '.join(kinds)} mutation applies")
    if row.mutations_applied < MIN_MUTATIONS:
        row.problems.append(f"only {row.mutations_applied} mutations apply (need {MIN_MUTATIONS})")


def survey(inst: Instance, row: CheckRow) -> CheckRow:
    """Fill in the gold-side figures of a row: the constant agent's verdict, negative or not, the gold."""
    with inst.open() as ep:
        row.nothing_found_passes = ep.finish(NOTHING_FOUND_REPLY).success
        label, draw = inst.family.stream(inst.seed)
        view = View(inst.world, ep.client, inst.now, draw, label)
        row.first_hit_distractor = inst.family.distractor_probe(view, inst.params)
    row.negative = inst.gold.answer is NOT_FOUND
    row.gold_key = gold_key(inst)
    return row


def survey_rows(fams: Iterable[Family], seeds: Iterable[int], world: TaskWorld) -> list[CheckRow]:
    """:func:`survey` of every family × seed, without running any agent (what :func:`figures` needs)."""
    seeds = list(seeds)
    return [survey(inst, CheckRow(fam.id, seed, False, None, False, None))
            for fam in fams for seed in seeds for inst in [make_instance(fam, seed, world)]]


def gold_key(inst: Instance) -> str:
    """The gold of an instance (answer, expected changes with their values and ids) as one string."""
    changes = sorted(e.describe() for e in inst.gold.expects)
    return orjson.dumps([render(inst.gold.answer), changes], option=orjson.OPT_SORT_KEYS).decode()


def instance_bytes(inst: Instance) -> bytes:
    """Everything an instance fixes before an agent acts (prompt, clock, params, setup resources, gold), as
    canonical JSON: two runs that make the same instance give the same bytes."""
    return orjson.dumps({**inst.describe(), "setup": inst.setup}, option=orjson.OPT_SORT_KEYS)


def instances_sha256(fams: Iterable[Family], seeds: Iterable[int], world: TaskWorld) -> str:
    """One digest of every family × seed instance (held by a stored hash in the tests)."""
    digest = hashlib.sha256()
    seeds = list(seeds)
    for fam in fams:
        for seed in seeds:
            digest.update(instance_bytes(make_instance(fam, seed, world)))
    return digest.hexdigest()


@dataclass
class FamilyFigures:
    """The per-family figures ``tasks check`` gates on, over the checked seeds."""

    task_id: str
    seeds: int
    none_allowed: bool
    negative: int  # instances whose answer is "nothing found"
    constant: int  # instances the constant "nothing found" reply passes
    top_gold: int  # instances sharing the most frequent gold other than "nothing found"
    distracted: int  # instances with a distractor (Family.distractor_probe not None)
    first_hit: int  # of those, instances where the plain search's first hit is a distractor
    coded_applied: int = 0  # add_wrong_code runs (two per coded element the gold checks, per instance)
    coded_rejected: int = 0
    problems: list[str] = field(default_factory=list)


def figures(rows: list[CheckRow], fams: Iterable[Family]) -> tuple[list[FamilyFigures], list[str]]:
    """Negative shares, gold variety and the constant agent's score; with the problems they show."""
    by_id = {f.id: f for f in fams}
    out: list[FamilyFigures] = []
    for task_id in dict.fromkeys(r.task_id for r in rows):
        mine = [r for r in rows if r.task_id == task_id]
        fam = by_id[task_id]
        none_allowed = bool(fam.answer and fam.answer.none_allowed)
        golds = Counter(r.gold_key for r in mine if not r.negative)
        probes = [r.first_hit_distractor for r in mine if r.first_hit_distractor is not None]
        fig = FamilyFigures(task_id, len(mine), none_allowed, sum(r.negative for r in mine),
                            sum(r.nothing_found_passes for r in mine), max(golds.values(), default=0),
                            len(probes), sum(probes), sum(r.coded_applied for r in mine),
                            sum(r.coded_rejected for r in mine))
        n = fig.seeds
        if fig.negative == n:
            fig.problems.append("every instance is 'nothing found'")
        elif none_allowed and n >= 10 and min(fig.negative, n - fig.negative) < NEGATIVE_MIN * n:
            fig.problems.append(f"'nothing found' on {fig.negative}/{n} seeds (each kind needs ≥ {NEGATIVE_MIN:.0%})")
        if n >= 10 and fig.top_gold > GOLD_MAX * n:
            fig.problems.append(f"one gold on {fig.top_gold}/{n} seeds (at most {GOLD_MAX:.0%})")
        if fig.distracted and fig.first_hit < DISTRACTOR_MIN * fig.distracted:
            fig.problems.append(f"the first hit is a distractor on {fig.first_hit}/{fig.distracted} seeds "
                                f"(at least {DISTRACTOR_MIN:.0%})")
        out.append(fig)
    problems = [f"{f.task_id}: {p}" for f in out for p in f.problems]
    total, passed = sum(f.seeds for f in out), sum(f.constant for f in out)
    library = {f.id for f in families()} <= {f.task_id for f in out}  # a share of the whole library only
    if library and passed > CONSTANT_MAX * total:
        problems.append(f"the constant 'nothing found' reply passes {passed}/{total} (at most {CONSTANT_MAX:.0%})")
    return out, problems


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


@dataclass
class CheckSummary:
    """What ``tasks check`` reports over its rows: the tallies, the per-family figures, and whether the
    library passes (no instance with a problem, no failing family figure)."""

    rows: list[CheckRow]
    families: int
    seeds: int
    per_family: list[FamilyFigures]
    library_problems: list[str]

    @classmethod
    def of(cls, rows: list[CheckRow], fams: Iterable[Family], seeds: int) -> CheckSummary:
        fams = list(fams)
        per_family, problems = figures(rows, fams)
        return cls(rows, len(fams), seeds, per_family, problems)

    @property
    def problem_rows(self) -> list[CheckRow]:
        return [r for r in self.rows if not r.ok]

    @property
    def ok(self) -> bool:
        return not self.problem_rows and not self.library_problems

    def table(self) -> list[str]:
        """The per-family figures, a line a family (``--table``)."""
        out = [f"{'family':44} {'seeds':>5} {'none?':>5} {'negative':>8} {'constant':>8} {'top gold':>8} "
               f"{'distractor first':>16} {'wrong codes':>11}"]
        for f in self.per_family:
            bite = f"{f.first_hit}/{f.distracted}" if f.distracted else "-"
            coded = f"{f.coded_rejected}/{f.coded_applied}" if f.coded_applied else "-"
            out.append(f"{f.task_id:44} {f.seeds:5} {'yes' if f.none_allowed else '':>5} {f.negative:8} "
                       f"{f.constant:8} {f.top_gold:8} {bite:>16} {coded:>11}")
        return out

    def lines(self) -> list[str]:
        """The summary ``tasks check`` prints."""
        rows, n = self.rows, len(self.rows)
        writing = [r for r in rows if r.reference_light is not None or r.null_light is not None]
        ref_strict = sum(r.reference_strict for r in rows)
        constant = sum(r.nothing_found_passes for r in rows)
        negative = sum(r.negative for r in rows)
        out = [f"{self.families} families × {self.seeds} seeds = {n} instances",
               f"reference: strict {ref_strict}/{n} ({100 * ref_strict / max(1, n):.1f} %), "
               f"light {sum(bool(r.reference_light) for r in writing)}/{len(writing)} on writing instances",
               f"null:      strict {sum(r.null_strict for r in rows)}/{n}, "
               f"light {sum(bool(r.null_light) for r in writing)}/{len(writing)}",
               f"mutations: {sum(r.mutations_rejected for r in rows)}/{sum(r.mutations_applied for r in rows)} "
               "rejected by strict validation"]
        for name in MUTATIONS:
            got = [r.outcomes[name] for r in rows if name in r.outcomes]
            out.append(f"  {name:20} {sum(got)}/{len(got)} rejected")
            if name == "add_wrong_code":
                out.append(f"    (every coded element the gold checks, two codings each: "
                           f"{sum(r.coded_rejected for r in rows)}/{sum(r.coded_applied for r in rows)} runs rejected)")
        out.append(f"equivalent rewrites: {sum(r.equivalents_passed for r in rows)}/"
                   f"{sum(r.equivalents_applied for r in rows)} pass strict validation")
        for name in EQUIVALENTS:
            got = [r.outcomes[name] for r in rows if name in r.outcomes]
            out.append(f"  {name:20} {sum(got)}/{len(got)} pass")
        out += [f"constant 'nothing found' (no tool call): strict {constant}/{n} ({100 * constant / max(1, n):.2f} %)",
                f"gold 'nothing found' (what that reply earns after one look): {negative}/{n} "
                f"({100 * negative / max(1, n):.2f} %)",
                f"problems:  {len(self.problem_rows)} instances, {len(self.library_problems)} family figures"]
        return out
