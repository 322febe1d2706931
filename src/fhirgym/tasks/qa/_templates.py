"""Question templates in FHIR-AgentBench's style and the one engine that answers them.

A template is data: an event kind (labs, vitals, drugs, …), an operation (exists, first/last time, value, count,
min/max/mean, sum, difference, …), the time windows it may carry, the slots it samples and its phrasings. :func:`answer`
computes the gold answer and the gold resource ids of any template from a :class:`PatientFacts`; the tests recompute
both from the raw world file with SQL. Every gold answer follows the conventions stated in each question's context (only
records up to the assumed current time; entered-in-error ignored; a hospital visit is an inpatient Encounter (class
IMP), and an event belongs to it when its encounter is the visit or an Encounter ``partOf`` it; first/last visit among
finished visits; times in UTC): docs/QA.md, section "Conventions every gold answer follows".
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from random import Random

from ._facts import KINDS, Event, PatientFacts

SHAPES = ("yesno", "datetime", "text", "value", "sum", "count", "elapsed", "difference", "aggregate",
          "duration", "grouped", "datetime_list")
#: Window kinds: all time, calendar spans, spans relative to the assumed now, and hospital visits.
TIME_WINDOWS = ("all", "since", "year", "month", "this_year", "last_year")
WINDOWS = (*TIME_WINDOWS, "first_visit", "last_visit")
CASE_HINT = "When searching for values in the database, account for all variations in letter case and surrounding whitespace."
VISIT_HINT = ("A hospital visit is an inpatient Encounter (class IMP); its emergency and ICU stays are Encounters "
              "partOf it, and its events refer to one of these encounters. The first and last visits are among "
              "finished visits; the current visit is the one in progress at the current time.")
ERROR_HINT = "Ignore records marked entered-in-error."
DRUG_HINT = ("Drug names are the display of the medication's coding, inline or in the referenced Medication; "
             "the dose is dosageInstruction.doseAndRate.doseQuantity.")


class Ambiguous(Exception):
    """These parameters have no single right answer (e.g. two different values at the same time)."""


@dataclass(frozen=True)
class Template:
    id: str
    shape: str
    kind: str
    op: str
    texts: tuple[str, ...]
    windows: tuple[str, ...] = ("all",)
    slots: tuple[str, ...] = ()
    hint: str = ""
    fixed: dict = field(default_factory=dict)  # slot values fixed by the template (e.g. name: Body Weight)
    visit_anchor: bool = False  # the assumed now falls inside one of the patient's hospital stays

    @property
    def types(self) -> tuple[str, ...]:
        return KINDS[self.kind]


def T(id: str, shape: str, kind: str, op: str, *texts: str, **kw) -> Template:
    """A template in one line of the table below (phrasings as positional arguments)."""
    return Template(id, shape, kind, op, texts, **kw)


_W = {"windows": WINDOWS}
_TW = {"windows": TIME_WINDOWS}
_VISIT = {"windows": ("current_visit",), "visit_anchor": True}
WEIGHT = {"name": "Body Weight"}

TEMPLATES: tuple[Template, ...] = (
    # -- yes/no: existence and comparisons --------------------------------------------------------------
    T("lab_tested", "yesno", "lab", "exists", "Has patient {p} received a {name} lab test {window}?",
      "Did patient {p} have a {name} lab test {window}?", slots=("name",), **_W),
    T("any_lab", "yesno", "lab", "exists", "Has patient {p} received any lab test {window}?", **_W),
    T("drug_prescribed", "yesno", "drug", "exists", "Has patient {p} been prescribed {name} {window}?",
      "Was {name} prescribed to patient {p} {window}?", slots=("name",), **_W),
    T("drug_any_of_three", "yesno", "drug", "exists", "Has patient {p} been prescribed {name}, {name2}, or {name3} {window}?",
      slots=("names3",), **_W),
    T("any_drug", "yesno", "drug", "exists", "Has patient {p} been prescribed any medication {window}?", **_W),
    T("procedure_done", "yesno", "procedure", "exists", "Has patient {p} received a {name} procedure {window}?",
      "Did patient {p} undergo {name} {window}?", slots=("name",), **_W),
    T("any_procedure", "yesno", "procedure", "exists", "Has patient {p} received any procedure {window}?", **_W),
    T("diagnosed_with", "yesno", "diagnosis", "exists", "Has patient {p} been diagnosed with {name} {window}?",
      slots=("name",), **_W),
    T("any_diagnosis", "yesno", "diagnosis", "exists", "Has patient {p} received any diagnosis {window}?", **_W),
    T("ed_visit", "yesno", "ed", "exists", "Has patient {p} been to an emergency room {window}?", **_TW),
    T("admitted", "yesno", "admission", "exists", "Has patient {p} been admitted to the hospital {window}?", **_TW),
    T("specimen_collected", "yesno", "specimen", "exists", "Has patient {p} had a {name} collected {window}?",
      slots=("name",), **_TW),
    T("vital_ever_cmp", "yesno", "vital", "exists", "Has the {name} of patient {p} been ever {cmp} than {threshold} {window}?",
      slots=("name", "cmp"), **_W),
    T("lab_compare", "yesno", "lab", "compare",
      "Is the value of {name} of patient {p} last measured {window} {cmp} than the {earlier} value measured {window}?",
      slots=("name", "cmp", "pair"), **_W),
    T("vital_compare", "yesno", "vital", "compare",
      "Is the {name} of patient {p} last measured {window} {cmp} than the {earlier} value measured {window}?",
      slots=("name", "cmp", "pair"), **_W),
    # -- datetimes --------------------------------------------------------------------------------------
    T("lab_time", "datetime", "lab", "time", "When was the {which} time that patient {p} received a {name} lab test {window}?",
      slots=("name", "which"), **_W),
    T("vital_cmp_time", "datetime", "vital", "time",
      "When was the {which} time that the {name} of patient {p} was {cmp} than {threshold} {window}?",
      slots=("name", "which", "cmp"), **_W),
    T("lab_extreme_time", "datetime", "lab", "extreme_time",
      "When was the {which} time that patient {p} had the {sort} value of {name} {window}?",
      slots=("name", "which", "sort"), **_W),
    T("vital_extreme_time", "datetime", "vital", "extreme_time",
      "When was the {which} time that patient {p} had the {sort} {name} {window}?", slots=("name", "which", "sort"), **_W),
    T("drug_time", "datetime", "drug", "time", "When was the {which} time that patient {p} was prescribed {name} {window}?",
      slots=("name", "which"), **_W),
    T("prescription_time", "datetime", "drug", "time", "When was the {which} prescription time of patient {p} {window}?",
      slots=("which",), **_W),
    T("procedure_time", "datetime", "procedure", "time",
      "When was the {which} time that patient {p} received a {name} procedure {window}?", slots=("name", "which"), **_W),
    T("diagnosis_time", "datetime", "diagnosis", "time", "When was patient {p} {which} diagnosed with {name} {window}?",
      slots=("name", "which"), **_W),
    T("specimen_time", "datetime", "specimen", "time", "When was patient {p}'s {which} {name} collected {window}?",
      slots=("name", "which"), **_TW),
    T("admission_time", "datetime", "admission", "time", "When was the {which} hospital admission time of patient {p}?",
      slots=("which",)),
    T("discharge_time", "datetime", "discharge", "time", "When was the {which} hospital discharge time of patient {p}?",
      slots=("which",)),
    # -- categorical strings ----------------------------------------------------------------------------
    T("drug_name", "text", "drug", "name", "What was the name of the drug that patient {p} was {which} prescribed {window}?",
      slots=("which",), **_W),
    T("procedure_name", "text", "procedure", "name", "What was the name of the procedure that patient {p} {which} received {window}?",
      slots=("which",), **_W),
    T("diagnosis_name", "text", "diagnosis", "name", "What was the {which} diagnosis of patient {p} {window}?",
      slots=("which",), **_W),
    T("specimen_name", "text", "specimen", "name", "What was the name of the specimen that patient {p} was {which} tested {window}?",
      slots=("which",), **_TW),
    T("careunit", "text", "transfer", "name", "What was the {which} care unit of patient {p} {window}?",
      slots=("which",), windows=("all", "first_visit", "last_visit", "this_year", "last_year")),
    T("admit_source", "text", "admit_source", "name", "How was patient {p} admitted to the hospital (admission source) the {which} time?",
      slots=("which",)),
    T("discharge_disposition", "text", "disposition", "name",
      "Where was patient {p} discharged to after the {which} hospital visit?", slots=("which",)),
    T("gender", "text", "patient", "gender", "What is the gender of patient {p}?"),
    T("marital_status", "text", "patient", "marital", "What is the marital status of patient {p}?"),
    # -- single values ----------------------------------------------------------------------------------
    T("lab_value", "value", "lab", "value", "What was the {which} measured value of a {name} lab test of patient {p} {window}?",
      slots=("name", "which"), **_W),
    T("vital_value", "value", "vital", "value", "What was the {which} measured {name} of patient {p} {window}?",
      slots=("name", "which"), **_W),
    T("weight_value", "value", "vital", "value", "What was the {which} measured weight of patient {p} {window}?",
      slots=("which",), fixed=WEIGHT, hint="Search for 'Body Weight' to find weight.", **_W),
    T("drug_dose", "value", "drug", "value", "What was the dose of {name} that patient {p} was {which} prescribed {window}?",
      slots=("name", "which"), **_W),
    # -- sums -------------------------------------------------------------------------------------------
    T("drug_total_dose", "sum", "drug", "sum", "What was the total amount of dose of {name} that patient {p} was prescribed {window}?",
      slots=("name",), hint="I want the final output to be the sum of the retrieved results.", **_W),
    T("specimen_total_volume", "sum", "specimen", "sum", "What was the total volume of specimens collected from patient {p} {window}?",
      hint="I want the final output to be the sum of the retrieved results.", **_TW),
    T("icu_total_days", "sum", "icu", "sum", "How many days in total did patient {p} spend in the ICU {window}?",
      hint="I want the final output to be the sum of the finished ICU stays' lengths in days.", **_TW),
    # -- counts -----------------------------------------------------------------------------------------
    T("count_drugs", "count", "drug", "count", "Count the number of drugs patient {p} was prescribed {window}.", **_W),
    T("count_drug_times", "count", "drug", "count", "Count the number of times that patient {p} was prescribed {name} {window}.",
      slots=("name",), **_W),
    T("count_lab_times", "count", "lab", "count", "Count the number of times that patient {p} received a {name} lab test {window}.",
      slots=("name",), **_W),
    T("count_procedure_times", "count", "procedure", "count",
      "Count the number of times that patient {p} received a {name} procedure {window}.", slots=("name",), **_W),
    T("count_admissions", "count", "admission", "count", "Count the number of hospital visits of patient {p} {window}.", **_TW),
    T("count_icu", "count", "icu", "count", "Count the number of ICU visits of patient {p} {window}.", **_TW),
    # -- elapsed time since an event on the current visit -----------------------------------------------
    T("since_admission", "elapsed", "admission", "elapsed_stay",
      "How many {unit} have passed since patient {p} was admitted to the hospital currently?", slots=("unit",), **_VISIT),
    T("since_icu", "elapsed", "icu", "elapsed_stay",
      "How many {unit} have passed since patient {p} was admitted to the ICU currently?", slots=("unit",), **_VISIT),
    T("since_lab", "elapsed", "lab", "elapsed",
      "How many {unit} have passed since the {which} time patient {p} received a {name} lab test {window}?",
      slots=("name", "which", "unit"), **_VISIT),
    T("since_vital", "elapsed", "vital", "elapsed",
      "How many {unit} have passed since the {which} time the {name} of patient {p} was measured {window}?",
      slots=("name", "which", "unit"), **_VISIT),
    T("since_careunit", "elapsed", "transfer", "elapsed",
      "How many {unit} have passed since the {which} time patient {p} stayed in care unit {name} {window}?",
      slots=("name", "which", "unit"), **_VISIT),
    # -- differences between two measurements -----------------------------------------------------------
    T("lab_change", "difference", "lab", "difference",
      "What is the change in the value of {name} of patient {p} from the {earlier} value measured {window} to the last value measured {window}?",
      slots=("name", "pair"), **_W),
    T("vital_change", "difference", "vital", "difference",
      "What is the change in the {name} of patient {p} from the {earlier} value measured {window} to the last value measured {window}?",
      slots=("name", "pair"), **_W),
    T("weight_change", "difference", "vital", "difference",
      "How much does patient {p}'s weight differ from the {earlier} value measured {window} to the last value measured {window}?",
      slots=("pair",), fixed=WEIGHT, hint="Search for 'Body Weight' to find weight.", **_W),
    # -- min / max / mean -------------------------------------------------------------------------------
    T("lab_aggregate", "aggregate", "lab", "aggregate", "What was the {agg} {name} value of patient {p} {window}?",
      slots=("name", "agg"), **_W),
    T("vital_aggregate", "aggregate", "vital", "aggregate", "What was the {agg} {name} of patient {p} {window}?",
      slots=("name", "agg"), **_W),
    # -- length of stay ---------------------------------------------------------------------------------
    T("icu_length_of_stay", "duration", "icu", "stay_length", "What was the {which} length of ICU stay of patient {p}?",
      slots=("which",), hint="Give the length in days."),
    T("hospital_length_of_stay", "duration", "admission", "stay_length",
      "What was the {which} length of hospital stay of patient {p}?", slots=("which",), hint="Give the length in days."),
    # -- grouped by period ------------------------------------------------------------------------------
    T("vital_by_period", "grouped", "vital", "grouped", "List the {period} {agg} {name} of patient {p} {window}.",
      slots=("name", "period", "agg"), **_W),
    T("lab_by_period", "grouped", "lab", "grouped", "List the {period} {agg} {name} lab value of patient {p} {window}.",
      slots=("name", "period", "agg"), **_W),
    T("weight_by_period", "grouped", "vital", "grouped", "List the {period} {agg} weight of patient {p} {window}.",
      slots=("period", "agg"), fixed=WEIGHT, hint="Search for 'Body Weight' to find weight.", **_W),
    # -- datetime lists ---------------------------------------------------------------------------------
    T("admission_times", "datetime_list", "admission", "times", "List the hospital admission times of patient {p} {window}.",
      **_TW),
    T("procedure_times", "datetime_list", "procedure", "times", "List the times patient {p} received a {name} procedure {window}.",
      slots=("name",), **_W),
)
BY_ID = {t.id: t for t in TEMPLATES}
assert len(BY_ID) == len(TEMPLATES)

AGG = {"minimum": min, "maximum": max, "average": statistics.fmean}
PERIOD_KEY = {"daily": "%Y-%m-%d", "monthly": "%Y-%m", "yearly": "%Y"}
UNIT_SECONDS = {"hours": 3600, "days": 86400}
MAX_STAY_DAYS = 60


# -- windows -------------------------------------------------------------------------------------------
def fmt(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def window_text(window: str) -> str:
    kind, _, arg = window.partition(":")
    if kind == "since":
        return f"since {arg}"
    if kind == "year":
        return f"in {arg}"
    if kind == "month":
        y, m = arg.split("-")
        return f"in {m}/{y}"
    return {"all": "", "this_year": "this year", "last_year": "last year", "first_visit": "on the first hospital visit",
            "last_visit": "on the last hospital visit", "current_visit": "on the current hospital visit"}[kind]


def visits(facts: PatientFacts, anchor: datetime) -> tuple[list[Event], Event | None]:
    """The finished hospital visits up to ``anchor`` (by start) and the one in progress at ``anchor``."""
    started = [e for e in facts.of("admission") if e.time <= anchor]
    finished = [e for e in started if e.end is not None and e.end <= anchor]
    current = next((e for e in reversed(started) if e.end is None or e.end > anchor), None)
    return finished, current


def window_test(window: str, facts: PatientFacts, anchor: datetime) -> Callable[[Event], bool]:
    """Is an event inside ``window`` (and not after ``anchor``)? Built once per question, used per event."""
    kind, _, arg = window.partition(":")
    if kind == "all":
        return lambda e: e.time <= anchor
    if kind == "since":
        since = datetime.fromisoformat(arg).replace(tzinfo=UTC)
        return lambda e: since <= e.time <= anchor
    if kind == "year":
        return lambda e: e.time <= anchor and e.time.year == int(arg)
    if kind == "month":
        year, month = (int(x) for x in arg.split("-"))
        return lambda e: e.time <= anchor and (e.time.year, e.time.month) == (year, month)
    if kind in ("this_year", "last_year"):
        wanted = anchor.year - (kind == "last_year")
        return lambda e: e.time <= anchor and e.time.year == wanted
    finished, current = visits(facts, anchor)
    visit = {"first_visit": finished[0] if finished else None, "last_visit": finished[-1] if finished else None,
             "current_visit": current}[kind]
    if visit is None:
        return lambda e: False
    return lambda e: e.time <= anchor and facts.visit_of.get(e.encounter or "") == visit.id


def selected(template: Template, facts: PatientFacts, params: dict, anchor: datetime) -> list[Event]:
    """The events a question is about: its kind, name(s) (case-insensitive) and window."""
    names = params.get("names") or ([params["name"]] if "name" in params else None)
    wanted = {n.strip().casefold() for n in names} if names else None
    inside = window_test(params.get("window", "all"), facts, anchor)
    return [e for e in facts.of(template.kind) if (wanted is None or e.name.strip().casefold() in wanted)
            and inside(e)]


# -- the engine ----------------------------------------------------------------------------------------
def _cmp(value: float, cmp: str, other: float) -> bool:
    return value > other if cmp == "greater" else value < other


def _at(events: list[Event], which: str) -> list[Event]:
    """The first (or last) events in time, ties included."""
    if not events:
        return []
    t = events[0].time if which == "first" else events[-1].time
    return [e for e in events if e.time == t]


def _one_value(events: list[Event]) -> float:
    values = {e.value for e in events}
    if len(values) != 1 or None in values:
        raise Ambiguous("several values at one time")
    return values.pop()


def _pair(events: list[Event], pair: str) -> tuple[list[Event], list[Event]] | None:
    """(earlier, last) measurement: the first or the second-to-last one, and the last one.

    Records at one time are one measurement (Synthea charts some vitals twice, with the same value).
    """
    times = sorted({e.time for e in events})
    if len(times) < 2:
        return None
    earlier = times[0] if pair == "first" else times[-2]
    return [e for e in events if e.time == earlier], [e for e in events if e.time == times[-1]]


def answer(template: Template, facts: PatientFacts, params: dict, anchor: datetime) -> tuple[object, list[Event]]:
    """(gold answer, the events holding it); the answer is None when the question has no answer."""
    op = template.op
    if op in ("gender", "marital"):
        p = facts.patient
        value = p.get("gender") if op == "gender" else (p.get("maritalStatus", {}).get("coding") or [{}])[0].get("display")
        return ([value], [Event("Patient", p["id"], "", anchor)]) if value else (None, [])
    if op == "elapsed_stay":
        _, current = visits(facts, anchor)
        stays = [e for e in facts.of(template.kind) if e.time <= anchor and (e.end is None or e.end > anchor)
                 and current is not None and facts.visit_of.get(e.id) == current.id]
        if not stays:
            return None, []
        return round((anchor - stays[-1].time).total_seconds() / UNIT_SECONDS[params["unit"]], 4), stays[-1:]
    if op == "stay_length":
        finished = [e for e in facts.of(template.kind) if e.end is not None and e.end <= anchor]
        chosen = finished[:1] if params["which"] == "first" else finished[-1:]
        return (round(chosen[0].value, 4), chosen) if chosen else (None, [])
    events = selected(template, facts, params, anchor)
    if "threshold" in params:  # "... ever greater than 120", "the first time ... was less than 90"
        events = [e for e in events if e.value is not None and _cmp(e.value, params["cmp"], params["threshold"])]
    if op == "exists":
        return bool(events), events
    if op == "count":
        return len(events), events
    if op == "times":
        return ([fmt(e.time) for e in events] or None), events
    if op in ("sum", "aggregate", "grouped"):
        if template.kind == "icu":
            events = [e for e in events if e.end is not None and e.end <= anchor]
        events = [e for e in events if e.value is not None]
    if not events:
        return None, []
    if op == "time":
        chosen = _at(events, params["which"])
        return fmt(chosen[0].time), chosen
    if op == "extreme_time":
        best = (max if params["sort"] == "highest" else min)(e.value for e in events)
        chosen = _at([e for e in events if e.value == best], params["which"])
        return fmt(chosen[0].time), chosen
    if op == "name":
        chosen = _at(events, params["which"])
        return sorted({e.name for e in chosen}), chosen
    if op == "value":
        chosen = _at(events, params["which"])
        return round(_one_value(chosen), 4), chosen
    if op == "sum":
        return round(sum(e.value for e in events), 4), events
    if op == "aggregate":
        return round(AGG[params["agg"]]([e.value for e in events]), 4), events
    if op == "grouped":
        groups: dict[str, list[float]] = {}
        for e in events:
            groups.setdefault(e.time.strftime(PERIOD_KEY[params["period"]]), []).append(e.value)
        return [round(AGG[params["agg"]](v), 4) for _, v in sorted(groups.items())], events
    if op == "elapsed":
        chosen = _at(events, params["which"])
        return round((anchor - chosen[0].time).total_seconds() / UNIT_SECONDS[params["unit"]], 4), chosen
    if op in ("difference", "compare"):
        pair = _pair(events, params["pair"])
        if pair is None:
            return None, []
        earlier, last = _one_value(pair[0]), _one_value(pair[1])
        if op == "compare":
            return _cmp(last, params["cmp"], earlier), pair[0] + pair[1]
        return round(last - earlier, 4), pair[0] + pair[1]
    raise ValueError(f"unknown op {op!r}")


# -- sampling ------------------------------------------------------------------------------------------
def _window(template: Template, facts: PatientFacts, rng: Random, anchor: datetime) -> str:
    kind = rng.choice(template.windows)
    if kind not in ("since", "year", "month"):
        return kind
    own = [e.time for e in facts.of(template.kind) if e.time <= anchor]
    t = rng.choice(own) if own and rng.random() < 0.85 else datetime(rng.randint(2000, anchor.year), rng.randint(1, 12),
                                                                         rng.randint(1, 28), tzinfo=UTC)
    if kind == "since":
        return f"since:{(t.date() - timedelta(days=rng.randint(0, 400))).isoformat()}"
    return f"year:{t.year}" if kind == "year" else f"month:{t.strftime('%Y-%m')}"


def sample_params(template: Template, facts: PatientFacts, vocab: dict[str, list[str]], rng: Random,
                  want_empty: bool, anchor: datetime) -> dict:
    """Parameters for one question; ``want_empty`` leans the draw towards a question without answer."""
    params: dict = dict(template.fixed)
    if template.windows != ("all",):
        params["window"] = template.windows[0] if len(template.windows) == 1 else _window(template, facts, rng, anchor)
    own = selected(template, facts, {"window": params.get("window", "all")}, anchor)
    mine = sorted({e.name for e in own}) or sorted({e.name for e in facts.of(template.kind)})
    pool = vocab.get(template.kind, [])
    for slot in template.slots:
        if slot == "name":
            params["name"] = rng.choice(pool if (want_empty or not mine) and pool else mine or [""])
        elif slot == "names3":
            first = rng.choice(pool if (want_empty or not mine) and pool else mine or [""])
            others = rng.sample([n for n in pool if n != first], k=min(2, max(0, len(pool) - 1)))
            params["names"] = sorted([first, *others], key=lambda _: rng.random())
        elif slot == "which":
            params["which"] = rng.choice(("first", "last"))
        elif slot == "cmp":
            params["cmp"] = rng.choice(("greater", "less"))
        elif slot == "sort":
            params["sort"] = rng.choice(("highest", "lowest"))
        elif slot == "agg":
            params["agg"] = rng.choice(tuple(AGG))
        elif slot == "period":
            params["period"] = rng.choice(tuple(PERIOD_KEY))
        elif slot == "unit":
            params["unit"] = rng.choice(tuple(UNIT_SECONDS))
        elif slot == "pair":
            params["pair"] = rng.choice(("first", "second_to_last"))
    if "cmp" in params and template.op in ("exists", "time"):
        values = [e.value for e in selected(template, facts, params, anchor) if e.value is not None]
        params["threshold"] = round(rng.choice(values), 1) if values else float(rng.randint(1, 150))
    return params


def render_question(template: Template, facts: PatientFacts, params: dict, rng: Random) -> str:
    names = params.get("names") or [params.get("name", "")] * 3
    text = rng.choice(template.texts).format(
        p=facts.label, name=names[0], name2=names[1], name3=names[2], window=window_text(params.get("window", "all")),
        which=params.get("which", ""), cmp=params.get("cmp", ""), threshold=params.get("threshold", ""),
        sort=params.get("sort", ""), agg=params.get("agg", ""), period=params.get("period", ""),
        unit=params.get("unit", ""), earlier={"first": "first", "second_to_last": "second to last"}.get(params.get("pair", ""), ""))
    return " ".join(text.split()).replace(" ?", "?").replace(" .", ".")


def context_text(template: Template, params: dict, anchor: datetime) -> str:
    """The assumption lines, FHIR-AgentBench style: current time, search hints, conventions."""
    parts = [f"Assume the current time is {fmt(anchor)}.", ERROR_HINT]
    if "name" in params or "names" in params:
        parts.append(CASE_HINT)
    if template.kind == "drug":
        parts.append(DRUG_HINT)
    if "visit" in params.get("window", "") or template.visit_anchor or template.kind in ("admission", "icu", "transfer",
                                                                                          "discharge", "disposition"):
        parts.append(VISIT_HINT)
    if template.shape in ("elapsed",):
        parts.append(f"Give the elapsed time in {params['unit']}.")
    if template.shape == "difference":
        parts.append("Report the last value minus the earlier one.")
    if template.shape == "grouped":
        parts.append(f"If several values fall in one period, take the {params['agg']}; list one value per period in time order.")
    if template.hint:
        parts.append(template.hint)
    return " ".join(parts)


def vocabulary(all_facts: list[PatientFacts]) -> dict[str, list[str]]:
    """Names per kind across the world: what a question may ask about (present or not for its patient)."""
    out: dict[str, set[str]] = {}
    for facts in all_facts:
        for kind, events in facts.events.items():
            out.setdefault(kind, set()).update(e.name for e in events)
    return {k: sorted(v) for k, v in out.items()}


def visit_anchor(facts: PatientFacts, rng: Random, default: datetime) -> datetime:
    """An assumed now inside one of the patient's hospital stays (the default when it has none or one is ongoing)."""
    stays = [e for e in facts.of("admission") if e.time < default]
    if not stays:
        return default
    # hospital-length stays first: Synthea's rare years-long "inpatient" encounters make odd current visits
    stays = [e for e in stays if e.end is None or e.end - e.time <= timedelta(days=MAX_STAY_DAYS)] or stays
    stay = rng.choice(stays)
    if stay.end is None or stay.end >= default:
        return default
    span = (stay.end - stay.time).total_seconds()
    moment = stay.time + timedelta(seconds=rng.uniform(min(3600, span / 2), span))
    return moment.replace(second=0, microsecond=0)


def default_anchor(anchor_day: date) -> datetime:
    """The world's anchor day at 00:00 minus a minute: after every record (like FHIR-AgentBench's 23:59)."""
    return datetime(anchor_day.year, anchor_day.month, anchor_day.day, tzinfo=UTC) - timedelta(minutes=1)
