"""Reference CodeAct programs: the fetches and the Python a QA question needs, written out as source.

For each question, :func:`reference_program` gives the ``fhir_query`` (or ``fhir_get``) calls that bring the patient's
records into the CodeAct workspace and a short stdlib-only Python program that computes the gold answer from
``retrieved_resources``. The program is what a skilled agent would write: it re-derives events from the raw FHIR JSON by
the conventions the question states, so it is a third implementation of the ground truth next to the generator
(``_facts.py`` + ``_templates.py``) and the tests' SQL oracle, and, replayed through an episode, a verified expert
trajectory to clone. The source is generated, not hand-written per template, imports nothing but ``datetime`` (it runs
in the sandbox) and is deterministic; its ``answer`` has the gold's form, and :func:`program_reply` writes the final
reply from it (docs/QA.md, section "Reference CodeAct programs").
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from typing import Any

from ._generate import QaQuestion
from ._templates import BY_ID, Template

#: The reply an agent gives after the program ran: this prefix, then :func:`render_answer` of its answer.
REPLY_PREFIX = "The final answer is: "
#: Event kinds that come from Encounters (no other fetch needed for hospital visits).
_ENCOUNTER_KINDS = {"admission": "IMP", "icu": "ACUTE", "ed": "EMER"}
_VISIT_WINDOWS = ("first_visit", "last_visit", "current_visit")
#: Operations whose events keep only those with a value (``sum``, min/max/mean, grouped by period).
_VALUED = ("sum", "aggregate", "grouped")
_SECONDS = {"hours": 3600, "days": 86400}
_AGG = {"minimum": "min({0})", "maximum": "max({0})", "average": "sum({0}) / len({0})"}


@dataclass(frozen=True)
class Program:
    """The tool calls of a reference CodeAct run: ``fetches`` first, then one ``python`` call of ``code``."""

    template: str
    fetches: tuple[dict, ...]  # {"name": "fhir_query" | "fhir_get", "arguments": {...}}, in order
    code: str

    def python_call(self) -> dict:
        return {"name": "python", "arguments": {"code": self.code}}

    def tool_calls(self) -> list[dict]:
        """Every call in order, as ``Episode.step`` takes them."""
        return [*self.fetches, self.python_call()]


def render_answer(answer: Any) -> str:
    """The program's ``answer`` as reply text: "no answer" for None (or an empty list), yes/no for a bool,
    a list joined by ", ", anything else as ``str`` (the program rounds its numbers)."""
    if answer is None or answer == []:
        return "no answer"
    if isinstance(answer, bool):
        return "yes" if answer else "no"
    if isinstance(answer, list):
        return ", ".join(render_answer(a) for a in answer)
    if isinstance(answer, float) and "e" in repr(answer):  # 1e-05: the matcher reads plain decimals only
        return f"{answer:.6f}".rstrip("0").rstrip(".")
    return str(answer)


def program_reply(answer: Any) -> str:
    """The final reply after the program: ``"The final answer is: <render_answer(answer)>"``."""
    return REPLY_PREFIX + render_answer(answer)


def reference_program(question: QaQuestion) -> Program:
    """The fetches and the Python that answer ``question`` (a :class:`QaQuestion` of a known template)."""
    template = BY_ID.get(question.template)
    if template is None:
        raise ValueError(f"no reference program for unknown template {question.template!r}")
    return Program(template.id, _fetches(template, question), _source(template, question.params, question.anchor))


# -- fetches ---------------------------------------------------------------------------------------------
def _needs_visits(template: Template, params: dict) -> bool:
    return template.op == "elapsed_stay" or params.get("window", "all") in _VISIT_WINDOWS


def _fetches(template: Template, question: QaQuestion) -> tuple[dict, ...]:
    """The kind's own types first (a "no answer" needs that look), then Encounters where visits matter."""
    pid = question.patient_id

    def query(rtype: str) -> dict:
        return {"name": "fhir_query", "arguments": {"resource_type": rtype, "patient_id": pid}}

    kind = template.kind
    if kind == "transfer":  # care units are Locations the admissions point to: one search brings both
        return ({"name": "fhir_get", "arguments": {"query": f"Encounter?patient={pid}&_include=Encounter:location"}},)
    own = {"lab": "Observation", "vital": "Observation", "drug": "MedicationRequest", "procedure": "Procedure",
           "diagnosis": "Condition", "specimen": "Specimen", "patient": "Patient"}.get(kind, "Encounter")
    calls = [query(own)]
    if own != "Encounter" and _needs_visits(template, question.params):
        calls.append(query("Encounter"))
    return tuple(calls)


# -- source ----------------------------------------------------------------------------------------------
def _lit(value: Any) -> str:
    """A Python literal of a str, number or list of str (double-quoted, like the rest of the source)."""
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, str | list) else repr(value)
    assert ast.literal_eval(text) == value, value
    return text


HELPERS = '''\
from datetime import datetime, timezone


def when(text):
    """A FHIR dateTime as an aware UTC datetime (a date alone is midnight UTC)."""
    t = datetime.fromisoformat(text)
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)
'''
DISPLAY = '''

def display(concept):
    """The first display of a CodeableConcept's codings, else its text."""
    for coding in (concept or {}).get("coding", []):
        if coding.get("display"):
            return coding["display"]
    return (concept or {}).get("text")
'''
REF_ID = '''

def ref_id(reference):
    """The id of a Reference ("Encounter/123" -> "123")."""
    return (reference or {}).get("reference", "").rpartition("/")[2] or None
'''
FMT = '''

def fmt(t):
    return t.strftime("%Y-%m-%d %H:%M:%S")
'''
VISITS = '''
# hospital visits: inpatient Encounters (class IMP); an Encounter partOf one (ED, ICU) belongs to it
visits, visit_of = [], {}
for r in retrieved_resources.get("Encounter", []):
    period = r.get("period", {})
    if r.get("status") == "entered-in-error" or not period.get("start"):
        continue
    if r.get("class", {}).get("code") == "IMP":
        end = when(period["end"]) if period.get("end") else None
        visits.append({"id": r["id"], "time": when(period["start"]), "end": end})
        visit_of[r["id"]] = r["id"]
    elif r.get("partOf"):
        visit_of[r["id"]] = ref_id(r["partOf"])
visits.sort(key=lambda v: (v["time"], v["id"]))
'''
PICK_VISIT = {
    "first_visit": ('finished = [v for v in visits if v["end"] and v["end"] <= NOW]',
                    'visit = finished[0]["id"] if finished else None  # the first finished visit'),
    "last_visit": ('finished = [v for v in visits if v["end"] and v["end"] <= NOW]',
                   'visit = finished[-1]["id"] if finished else None  # the last finished visit'),
    "current_visit": ('current = [v for v in visits if v["time"] <= NOW and (v["end"] is None or v["end"] > NOW)]',
                      'visit = current[-1]["id"] if current else None  # the visit in progress now'),
}


def _kind_block(kind: str, with_enc: bool) -> list[str]:
    """Lines that fill ``events`` (dicts: id, time, name, value, and enc/end where needed) from the raw JSON."""
    enc = ', "enc": ref_id(r.get("encounter"))' if with_enc else ""
    skip_error = ['    if r.get("status") == "entered-in-error":', "        continue"]
    if kind in ("lab", "vital"):
        category = ('"laboratory" in cats' if kind == "lab"
                    else '"vital-signs" in cats and "laboratory" not in cats')
        return ["events = []",
                'for r in retrieved_resources.get("Observation", []):', *skip_error,
                '    cats = {c.get("code") for cat in r.get("category", []) for c in cat.get("coding", [])}',
                '    qty = r.get("valueQuantity") or {}',
                '    name, t = display(r.get("code")), r.get("effectiveDateTime")',
                f'    if {category} and "value" in qty and name and t:',
                f'        events.append({{"id": r["id"], "time": when(t), "name": name, "value": qty["value"]{enc}}})']
    if kind == "drug":
        return ['meds = {m["id"]: m for m in retrieved_resources.get("Medication", [])}',
                "events = []",
                'for r in retrieved_resources.get("MedicationRequest", []):', *skip_error,
                '    med_id = ref_id(r.get("medicationReference"))',
                '    name = display(meds.get(med_id, {}).get("code") if med_id else r.get("medicationCodeableConcept"))',
                '    doses = [dr["doseQuantity"] for d in r.get("dosageInstruction", [])',
                '             for dr in d.get("doseAndRate", []) if "doseQuantity" in dr]',
                '    dose = doses[0].get("value") if doses else None',
                '    if name and r.get("authoredOn"):',
                f'        events.append({{"id": r["id"], "time": when(r["authoredOn"]), "name": name, "value": dose{enc}}})']
    if kind == "procedure":
        return ["events = []",
                'for r in retrieved_resources.get("Procedure", []):', *skip_error,
                '    name, t = display(r.get("code")), r.get("performedDateTime") or r.get("performedPeriod", {}).get("start")',
                "    if name and t:",
                f'        events.append({{"id": r["id"], "time": when(t), "name": name, "value": None{enc}}})']
    if kind == "diagnosis":
        return ["events = []",
                'for r in retrieved_resources.get("Condition", []):',
                '    status = {c.get("code") for c in r.get("verificationStatus", {}).get("coding", [])}',
                '    name, t = display(r.get("code")), r.get("onsetDateTime") or r.get("recordedDate")',
                '    if "entered-in-error" not in status and name and t:',
                f'        events.append({{"id": r["id"], "time": when(t), "name": name, "value": None{enc}}})']
    if kind == "specimen":
        return ["events = []",
                'for r in retrieved_resources.get("Specimen", []):', *skip_error,
                '    collection = r.get("collection", {})',
                '    name, t = display(r.get("type")), collection.get("collectedDateTime")',
                "    if name and t:",
                '        volume = collection.get("quantity", {}).get("value")',
                '        events.append({"id": r["id"], "time": when(t), "name": name, "value": volume})']
    if kind in _ENCOUNTER_KINDS:
        return ["events = []",
                'for r in retrieved_resources.get("Encounter", []):',
                f'    if r.get("status") == "entered-in-error" or r.get("class", {{}}).get("code") != "{_ENCOUNTER_KINDS[kind]}":',
                "        continue",
                '    start, end = r.get("period", {}).get("start"), r.get("period", {}).get("end")',
                "    if start:",
                "        days = (when(end) - when(start)).total_seconds() / 86400 if end else None",
                '        events.append({"id": r["id"], "time": when(start), "end": when(end) if end else None,',
                f'                       "name": "{kind}", "value": days, "enc": r["id"]}})']
    inpatient = ['for r in retrieved_resources.get("Encounter", []):',
                 '    period = r.get("period", {})',
                 '    if r.get("status") == "entered-in-error" or r.get("class", {}).get("code") != "IMP":',
                 "        continue"]
    if kind == "transfer":
        return ['units = {r["id"]: r.get("name", r["id"]) for r in retrieved_resources.get("Location", [])}',
                "events = []  # one per stay in a care unit during a hospital visit", *inpatient,
                '    if not period.get("start"):', "        continue",
                '    for stay in r.get("location", []):',
                '        unit, t = units.get(ref_id(stay.get("location"))), stay.get("period", {}).get("start")',
                "        if unit and t:",
                '            events.append({"id": r["id"], "time": when(t), "name": unit, "value": None, "enc": r["id"]})']
    if kind == "admit_source":
        return ["events = []", *inpatient,
                '    source = display(r.get("hospitalization", {}).get("admitSource"))',
                '    if period.get("start") and source:',
                '        events.append({"id": r["id"], "time": when(period["start"]), "name": source, "value": None})']
    if kind == "discharge":
        return ["events = []  # discharges: the end of each hospital visit", *inpatient,
                '    if period.get("start") and period.get("end"):',
                '        events.append({"id": r["id"], "time": when(period["end"]), "name": "discharge", "value": None})']
    if kind == "disposition":
        return ["events = []  # at the end of each hospital visit", *inpatient,
                '    where = display(r.get("hospitalization", {}).get("dischargeDisposition"))',
                '    if period.get("start") and period.get("end") and where:',
                '        events.append({"id": r["id"], "time": when(period["end"]), "name": where, "value": None})']
    raise ValueError(f"no event block for kind {kind!r}")


def _window_lines(window: str) -> tuple[list[str], str]:
    """(constants, the condition on an event ``e``) of a window; the caller adds ``e["time"] <= NOW``."""
    kind, _, arg = window.partition(":")
    if kind == "since":
        return [f'SINCE = when("{arg}")'], 'SINCE <= e["time"]'
    if kind == "year":
        return [], f'e["time"].year == {int(arg)}'
    if kind == "month":
        year, month = (int(x) for x in arg.split("-"))
        return [], f'(e["time"].year, e["time"].month) == ({year}, {month})'
    if kind == "this_year":
        return [], 'e["time"].year == NOW.year'
    if kind == "last_year":
        return [], 'e["time"].year == NOW.year - 1'
    if kind in _VISIT_WINDOWS:
        return [], 'visit is not None and visit_of.get(e["enc"]) == visit'
    if kind == "all":
        return [], ""
    raise ValueError(f"unknown window {window!r}")


def _filter_line(template: Template, params: dict, condition: str) -> str:
    """The line keeping the events the question is about: up to now, in its window, its name(s), its threshold."""
    keep = ['e["time"] <= NOW'] + ([condition] if condition else [])
    if "name" in params:
        keep.append('e["name"].strip().lower() == NAME.strip().lower()')
    if "names" in params:
        keep.append('e["name"].strip().lower() in [n.strip().lower() for n in NAMES]')
    if "threshold" in params:
        keep.append(f'e["value"] is not None and e["value"] {">" if params["cmp"] == "greater" else "<"} THRESHOLD')
    if template.op in _VALUED and template.kind not in ("lab", "vital"):  # a lab or vital always has a value
        keep.append('e["value"] is not None')
        if template.kind == "icu":
            keep.append('e["end"] is not None and e["end"] <= NOW')
    return "events = [e for e in events if " + "\n          and ".join(keep) + "]"


def _op_lines(template: Template, params: dict) -> list[str]:
    """Lines that set ``answer`` from the time-ordered ``events``."""
    op = template.op
    first = params.get("which") == "first"
    at, which = ("events[0]", "the first") if first else ("events[-1]", "the last")
    if op == "elapsed_stay":  # the stay in progress now, on the current visit
        return ['stays = [e for e in events if e["time"] <= NOW and (e["end"] is None or e["end"] > NOW)',
                '         and visit is not None and visit_of.get(e["id"]) == visit]',
                "answer = None", "if stays:",
                f'    answer = round((NOW - stays[-1]["time"]).total_seconds() / {_SECONDS[params["unit"]]}, 4)'
                f'  # {params["unit"]}']
    if op == "stay_length":
        return ['finished = [e for e in events if e["end"] and e["end"] <= NOW]',
                "answer = None", "if finished:", f'    answer = round(finished[{0 if first else -1}]["value"], 4)  # days']
    if op == "exists":
        return ["answer = len(events) > 0"]
    if op == "count":
        return ["answer = len(events)"]
    if op == "times":
        return ['answer = [fmt(e["time"]) for e in events] or None']
    if op == "time":
        body = [f'answer = fmt({at}["time"])  # {which} time']
    elif op == "extreme_time":
        body = [f'best = {"max" if params["sort"] == "highest" else "min"}(e["value"] for e in events)',
                'at_best = [e for e in events if e["value"] == best]',
                f'answer = fmt(at_best[{0 if first else -1}]["time"])  # {which} time at the {params["sort"]} value']
    elif op == "name":
        body = [f't = {at}["time"]  # {which} time (every record at that time)',
                'answer = sorted({e["name"] for e in events if e["time"] == t})']
    elif op == "value":
        body = [f'answer = round({at}["value"], 4)  # {which} value']
    elif op == "sum":
        body = ['answer = round(sum(e["value"] for e in events), 4)']
    elif op == "aggregate":
        body = ['values = [e["value"] for e in events]', f"answer = round({_AGG[params['agg']].format('values')}, 4)"]
    elif op == "grouped":
        key = {"daily": "%Y-%m-%d", "monthly": "%Y-%m", "yearly": "%Y"}[params["period"]]
        body = ["groups = {}",
                "for e in events:",
                f'    groups.setdefault(e["time"].strftime("{key}"), []).append(e["value"])',
                f"answer = [round({_AGG[params['agg']].format('v')}, 4) for _, v in sorted(groups.items())]"]
    elif op == "elapsed":
        body = [f'answer = round((NOW - {at}["time"]).total_seconds() / {_SECONDS[params["unit"]]}, 4)'
                f'  # {params["unit"]} since {which} time']
    elif op in ("difference", "compare"):
        last = ("answer = round(last - earlier, 4)" if op == "difference"
                else f"answer = last {'>' if params['cmp'] == 'greater' else '<'} earlier")
        body = ['times = sorted({e["time"] for e in events})  # records at one time are one measurement',
                "if len(times) >= 2:",
                f'    earlier = next(e["value"] for e in events if e["time"] == times[{0 if params["pair"] == "first" else -2}])',
                '    last = next(e["value"] for e in events if e["time"] == times[-1])',
                f"    {last}"]
    else:
        raise ValueError(f"unknown op {op!r}")
    return ["answer = None", "if events:", *("    " + line for line in body)]


def _source(template: Template, params: dict, anchor: str) -> str:
    """The program: helpers, the question's values, hospital visits if needed, events, filter, answer."""
    kind, op = template.kind, template.op
    if kind == "patient":
        value = ('patient.get("gender")' if op == "gender"
                 else '((patient.get("maritalStatus") or {}).get("coding") or [{}])[0].get("display")')
        return "\n".join(['patient = (retrieved_resources.get("Patient") or [{}])[0]', f"value = {value}",
                          "answer = [value] if value else None"]) + "\n"
    visits = _needs_visits(template, params)
    window = "current_visit" if op == "elapsed_stay" else params.get("window", "all")
    helpers = HELPERS + DISPLAY + (REF_ID if kind in ("drug", "transfer") or visits else "")
    helpers += FMT if op in ("time", "extreme_time", "times") else ""
    consts = [f'NOW = when("{anchor}")  # the assumed current time']
    if "name" in params:
        consts.append(f"NAME = {_lit(params['name'])}")
    if "names" in params:
        consts.append(f"NAMES = {_lit(list(params['names']))}")
    if "threshold" in params:
        consts.append(f"THRESHOLD = {_lit(float(params['threshold']))}")
    window_consts, condition = _window_lines(window)
    lines = ["", "", *consts, *window_consts]
    if visits:
        lines += [VISITS.rstrip("\n"), *PICK_VISIT[window]]
    lines += ["", *_kind_block(kind, visits and kind != "transfer" and kind not in _ENCOUNTER_KINDS),
              'events.sort(key=lambda e: (e["time"], e["id"]))']
    if op not in ("elapsed_stay", "stay_length"):
        lines.append(_filter_line(template, params, condition))
    return helpers + "\n".join(lines + _op_lines(template, params)) + "\n"
