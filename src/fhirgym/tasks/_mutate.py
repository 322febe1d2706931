"""Perturbed reference solutions: proof that strict validators reject near-misses and accept rewrites.

Each *wrong* mutation runs a family's reference solution through a toolbox that corrupts its writes (or its answer) in
one way a careless or hostile agent would: the wrong target entity, a required element left out, a wrong value, a write
left out, an extra unrelated write, a scratch resource created and deleted again, a coding of another concept next to
the right one, a wrong target next to the right one, a modifier that negates the resource, an unknown
``modifierExtension``, a rewritten narrative or an added security label on an update, an answer hedged between two
candidates. A validator that passes one of them is too loose. Each *equivalent* mutation changes only the form (instants
with ``+00:00``, decimals with ``.0``, codings with the agent's own display, a content-identical update, the answer with
units or Reference objects, ...); a validator that fails one is too strict (docs/TASKS.md, "Checking a family").
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from ..spec.codes import CONFIDENTIALITY, CVX, LOINC, RXNORM, SNOMED
from ..tools import Toolbox, ToolCall
from ._answer import NOT_FOUND, AnswerSpec, render
from ._family import Instance, Verdict
from .checks import Check, ref_key, values

WRITES = ("createResource", "updateResource")
NA = object()  # an edit's answer: "this write offers nothing to mutate", try the next one
_REF = re.compile(r"^([A-Z][A-Za-z]+)/([A-Za-z0-9\-.]{1,64})$")


class _Mutating(Toolbox):
    """A toolbox whose first write call from the ``target``-th on that ``edit`` applies to is rewritten
    (``edit`` returns the new arguments or a (tool, arguments) pair, None to skip the call, or NA to leave
    it alone)."""

    def __init__(self, inner: Toolbox, edit: Callable[[Toolbox, str, dict], dict | None], target: int = 0) -> None:
        super().__init__(inner.tools.values(), inner.context)
        self.edit = edit
        self.target = target
        self.writes = 0
        self.applied = False

    def call(self, name: str, arguments: dict | None = None) -> ToolCall:
        if name in WRITES:
            index = self.writes
            self.writes += 1
            if index >= self.target and not self.applied:
                new = self.edit(self, name, copy.deepcopy(arguments or {}))
                if new is not NA:
                    self.applied = True
                    if new is None:
                        return ToolCall(name, arguments or {}, {"skipped": True}, None, None, 0.0)
                    name, arguments = new if isinstance(new, tuple) else (name, new)
        return super().call(name, arguments)


def _other_id(box: Toolbox, rtype: str, not_id: str) -> str | None:
    out = box.context.client.search(rtype, {"_count": "5", "_elements": "id"}).body or {}
    ids = [e["resource"]["id"] for e in out.get("entry", []) if e["resource"]["id"] != not_id]
    return ids[0] if ids else None


def _retarget(box: Toolbox, name: str, args: dict) -> dict | None:
    """Point the write at another entity: another patient in its references, or another resource id."""
    body = args.get("body") or {}
    for path, value in _walk(body):
        m = _REF.match(value) if isinstance(value, str) and path.endswith("reference") else None
        if m and m.group(1) == "Patient":
            other = _other_id(box, "Patient", m.group(2))
            if other:
                _set(body, path, f"Patient/{other}")
                return args
    target = args.get("resourceId", "") if name == "updateResource" else ""
    other = _other_id(box, args["resourceType"], target)
    if other:  # an update of another resource; for a create: overwriting an existing record instead
        current = box.context.client.read(args["resourceType"], other).body or {}
        new_body = {**current, **{k: v for k, v in body.items() if k not in ("id", "meta")}, "id": other}
        return "updateResource", {"resourceType": args["resourceType"], "resourceId": other, "body": new_body}
    return NA


def _walk(obj, path: str = ""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{path}.{k}" if path else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, obj


def _set(obj, path: str, value) -> None:
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    for part in parts[:-1]:
        obj = obj[int(part[1:-1])] if part.startswith("[") else obj[part]
    last = parts[-1]
    if last.startswith("["):
        obj[int(last[1:-1])] = value
    else:
        obj[last] = value


def _checked_keys(inst: Instance, rtype: str) -> list[str]:
    keys: list[str] = []
    for exp in inst.gold.expects:
        if exp.rtype == rtype:
            keys += [c.path.split(".")[0] for c in exp.checks if c.path not in ("id", "resourceType")]
    return list(dict.fromkeys(keys))


def _drop(inst: Instance) -> Callable:
    def edit(box: Toolbox, name: str, args: dict) -> dict | None:
        body = args.get("body") or {}
        for key in _checked_keys(inst, args.get("resourceType", "")):
            if key in body:
                del body[key]
                return args
        return NA
    return edit


def _mangle(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 7
    if isinstance(value, str):
        if re.match(r"^\d{4}-\d{2}-\d{2}", value):
            return str(int(value[:4]) - 1) + value[4:]
        m = _REF.match(value)
        if m:
            return f"{m.group(1)}/mutated-{m.group(2)}"[:60]
        return value + "-x" if value not in ("booked", "busy", "free", "cancelled") else (
            "proposed" if value in ("booked", "cancelled") else "busy-tentative")
    if isinstance(value, list):
        return [_mangle(v) for v in value]
    if isinstance(value, dict):
        return {k: (_mangle(v) if k not in ("system",) else v) for k, v in value.items()}
    return value


def _wrong_value(inst: Instance) -> Callable:
    def edit(box: Toolbox, name: str, args: dict) -> dict | None:
        body = args.get("body") or {}
        for key in _checked_keys(inst, args.get("resourceType", "")):
            if key in body:
                body[key] = _mangle(body[key])
                return args
        return NA
    return edit


def _skip(box: Toolbox, name: str, args: dict) -> dict | None:
    return None


def _checks(inst: Instance, rtype: str, kind: str) -> list[Check]:
    """The strict checks of this kind on writes of ``rtype`` (the ones an added value must break)."""
    return [c for e in inst.gold.expects if e.rtype == rtype for c in e.checks if c.kind == kind and not c.extras]


#: Real codes of another meaning, per system: what an agent that codes two concepts at once adds.
_RIVAL_CODES = {SNOMED: ("22298006", "38341003"), LOINC: ("2345-7", "718-7"), RXNORM: ("197361", "310965"),
                CVX: ("140", "08")}
#: A coding of another concept in another system (SNOMED's myocardial infarction; LOINC's creatinine
#: where the concept already is that one).
_FOREIGN = ({"system": SNOMED, "code": "22298006", "display": "Myocardial infarction"},
            {"system": LOINC, "code": "2160-0", "display": "Creatinine [Mass/volume] in Serum or Plasma"})
_OPS = {"createResource": "create", "updateResource": "update"}


def _concept_path(path: str) -> str:
    """The CodeableConcept a check's path is about (``code.coding.code`` → ``code``)."""
    return path.split(".coding")[0]


def coded_targets(inst: Instance) -> list[tuple[int, str]]:
    """Every coded element the gold checks in the reference's writes, as (write index, element path): the
    paths of the expectation's checks that hold CodeableConcepts in what the reference wrote."""
    out: list[tuple[int, str]] = []
    writes = [c for c in inst.reference.calls if c.name in WRITES]
    for i, call in enumerate(writes):
        body, rtype = call.arguments.get("body") or {}, call.arguments.get("resourceType")
        for exp in inst.gold.expects:
            if exp.rtype != rtype or exp.op != _OPS[call.name]:
                continue
            for check in exp.checks:
                path = _concept_path(check.path)
                if (i, path) not in out and any(isinstance(v, dict) and isinstance(v.get("coding"), list)
                                                for v in values(body, path)):
                    out.append((i, path))
    return out


def _rival(concept: dict, same_system: bool) -> dict:
    """A coding of another concept for ``concept``: in its own system, or in another one."""
    have = {(c.get("system"), c.get("code")) for c in concept["coding"] if isinstance(c, dict)}
    if not same_system:
        return dict(next(f for f in _FOREIGN if (f["system"], f["code"]) not in have))
    system, code = next(iter(sorted(have, key=str)), (SNOMED, ""))
    rival = next(r for r in _RIVAL_CODES.get(system, (f"{code}0", f"{code}1")) if (system, r) not in have)
    return {"system": system, "code": rival}


def _add_wrong_code(inst: Instance, variant: int) -> Callable:
    """At one coded element the gold checks (variant // 2 of :func:`coded_targets`), a second coding of
    another concept next to the right one: in another system (even variants) or in the same one (odd)."""
    index, path = coded_targets(inst)[variant // 2]

    def edit(box: Toolbox, name: str, args: dict) -> dict | None:
        if box.writes - 1 != index:
            return NA
        concepts = [v for v in values(args.get("body") or {}, path) if isinstance(v, dict)
                    and isinstance(v.get("coding"), list)]
        for concept in concepts:
            concept["coding"].append(_rival(concept, same_system=bool(variant % 2)))
        return args if concepts else NA
    return edit


def _recoded_display(inst: Instance) -> Callable:
    """The right codings with a display of the agent's own wording (the code is what counts)."""
    targets = coded_targets(inst)

    def edit(box: Toolbox, name: str, args: dict) -> dict | None:
        here = [path for i, path in targets if i == box.writes - 1]
        changed = False
        for path in here:
            for concept in values(args.get("body") or {}, path):
                for coding in concept.get("coding", []) if isinstance(concept, dict) else []:
                    if isinstance(coding, dict) and coding.get("code"):
                        coding["display"] = f"{coding.get('display') or coding['code']} (as the clinician wrote it)"
                        changed = True
        return args if changed else NA
    return edit


def _add_wrong_target(inst: Instance) -> Callable:
    """Next to the right reference in a repeating element, one to another resource of the same type."""
    def edit(box: Toolbox, name: str, args: dict) -> dict | None:
        body = args.get("body") or {}
        for check in _checks(inst, args.get("resourceType", ""), "ref"):
            top = check.path.split(".")[0]
            items = body.get(top)
            want = check.want if isinstance(check.want, str) else (check.want or [None])[0]
            if not isinstance(items, list) or not items or not want:
                continue
            rtype, rid = want.split("/", 1)
            other = _other_id(box, rtype, rid)
            clone = copy.deepcopy(items[0])
            for path, value in _walk({"x": clone}):
                if path.endswith("reference") and ref_key(value) and ref_key(value).split("/")[0] == rtype and other:
                    _set({"x": clone}, path, f"{rtype}/{other}")
                    items.append(clone)
                    return args
        return NA
    return edit


_DO_NOT_PERFORM = ("ServiceRequest", "MedicationRequest", "CommunicationRequest")
_ACTIVE = ("Patient", "RelatedPerson", "Practitioner", "Organization", "Location", "PractitionerRole")


def _flip_modifier(box: Toolbox, name: str, args: dict) -> dict | None:
    """The same resource, negated by a modifier element: an order not to do it, a retired record, an error."""
    body = args.get("body") or {}
    rtype = args.get("resourceType", "")
    if rtype in _DO_NOT_PERFORM:
        body["doNotPerform"] = True
    elif rtype in _ACTIVE:
        body["active"] = False
    elif "status" in body and body["status"] != "entered-in-error":
        body["status"] = "entered-in-error"
    else:
        return NA
    return args


def _modifier_extension(box: Toolbox, name: str, args: dict) -> dict | None:
    body = args.get("body") or {}
    body["modifierExtension"] = [{"url": "http://example.org/fhir/StructureDefinition/reverses-meaning",
                                  "valueBoolean": True}]
    return args


def _rewrite_narrative(box: Toolbox, name: str, args: dict) -> dict | None:
    """An update that also rewrites the narrative (nothing asked it to)."""
    if name != "updateResource":
        return NA
    args["body"]["text"] = {"status": "generated",
                            "div": '<div xmlns="http://www.w3.org/1999/xhtml"><p>Reviewed, nothing to add.</p></div>'}
    return args


def _add_security_label(box: Toolbox, name: str, args: dict) -> dict | None:
    """An update that also restricts who may see the record."""
    if name != "updateResource":
        return NA
    meta = args["body"].setdefault("meta", {})
    meta["security"] = [*meta.get("security", []), {
        "system": CONFIDENTIALITY, "code": "R"}]
    return args


_INSTANT = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?)Z$")


def _reserialised(obj):
    """The same content in another valid form: instants with ``+00:00``, Quantity values as decimals."""
    if isinstance(obj, dict):
        out = {k: _reserialised(v) for k, v in reversed(obj.items())}
        if type(out.get("value")) is int and ("unit" in out or "code" in out):
            out["value"] = float(out["value"])
        return out
    if isinstance(obj, list):
        return [_reserialised(v) for v in obj]
    if isinstance(obj, str) and (m := _INSTANT.match(obj)):
        return m.group(1) + "+00:00"
    return obj


def _equivalent_writes(box: Toolbox, name: str, args: dict) -> dict | None:
    new = _reserialised(args.get("body") or {})
    if new == args.get("body"):
        return NA
    args["body"] = new
    return args


def _hedged(spec: AnswerSpec, gold) -> str:
    """An answer that names the gold and a second candidate for one field (or says both "nothing" and a value)."""
    if gold is NOT_FOUND:
        f = spec.fields[0]
        return '<answer>{"found": false, "' + f.name + '": ' + orjson.dumps(_other(f.kind, None)).decode() + "}</answer>"
    shown = render(gold)
    f = spec.fields[0]
    value = shown[f.name][0] if isinstance(shown[f.name], list) and f.kind != "ids" else shown[f.name]
    if f.kind == "ids":
        hedge = [*value, "Resource/another-candidate"] if value else ["a", "b"]
    elif f.kind in ("id", "text"):
        hedge = f"{value}, {_other(f.kind, value)}"
    elif f.kind in ("int", "number"):
        hedge = f"{value} or {_other(f.kind, value)}"
    else:
        hedge = [value, _other(f.kind, value)]
    return "<answer>" + orjson.dumps({**shown, f.name: hedge}).decode() + "</answer>"


def _other(kind: str, value):
    if kind in ("int", "number"):
        return (value or 0) + 3
    if kind == "bool":
        return not value
    if kind in ("date", "datetime"):
        return "1999-01-01" if kind == "date" else "1999-01-01T00:00:00Z"
    return f"Resource/other-{value}" if kind == "id" else f"{value} or something else"


def _equivalent_answer(spec: AnswerSpec, gold) -> str:
    """The gold answer in other accepted forms: all-null for "nothing found", one-element lists, ids as
    Reference objects, numbers with a unit, instants with ``+00:00``."""
    if gold is NOT_FOUND:
        return "<answer>" + orjson.dumps({f.name: None for f in spec.fields}).decode() + "</answer>"
    shown = render(gold)
    out = {}
    for f in spec.fields:
        value = shown[f.name]
        if isinstance(value, list) and f.kind != "ids":
            value = value[0]
        if f.kind == "id":
            value = {"reference": f"Resource/{value}"}
        elif f.kind in ("int", "number"):
            value = f"{value} units"
        elif f.kind == "datetime" and isinstance(value, str):
            value = value.replace("Z", "+00:00")
        out[f.name.upper()] = value if f.kind in ("id", "ids", "int", "number") else [value]
    return "<answer>" + orjson.dumps(out).decode() + "</answer>"


@dataclass
class Outcome:
    mutation: str
    applied: bool
    verdict: Verdict | None

    @property
    def rejected(self) -> bool:
        return self.verdict is not None and not self.verdict.success


#: Wrong solutions: every applied one must fail strict validation.
MUTATIONS = ("wrong_target", "drop_field", "wrong_value", "skip_write", "extra_write", "transient_write",
             "add_wrong_code", "add_wrong_target", "flip_modifier", "modifier_extension", "rewrite_narrative",
             "add_security_label", "hedged_answer")
#: Right solutions in another form: every applied one must pass strict validation.
EQUIVALENTS = ("equivalent_writes", "recoded_display", "identical_update", "equivalent_answer")


def variants(inst: Instance, mutation: str) -> int:
    """How many runs a mutation has on an instance: ``add_wrong_code`` two per coded element the gold
    checks (another system's coding, the same system's), every other one a single run."""
    return 2 * len(coded_targets(inst)) if mutation == "add_wrong_code" else 1


def _edit(inst: Instance, mutation: str, variant: int) -> Callable | None:
    if mutation == "add_wrong_code":
        return _add_wrong_code(inst, variant)
    return {"wrong_target": _retarget, "drop_field": _drop(inst), "wrong_value": _wrong_value(inst),
            "skip_write": _skip, "add_wrong_target": _add_wrong_target(inst),
            "flip_modifier": _flip_modifier, "modifier_extension": _modifier_extension,
            "rewrite_narrative": _rewrite_narrative, "add_security_label": _add_security_label,
            "equivalent_writes": _equivalent_writes, "recoded_display": _recoded_display(inst)}.get(mutation)


def run_mutation(inst: Instance, mutation: str, variant: int = 0) -> Outcome:
    """Run the reference solution of ``inst`` perturbed by ``mutation`` (its ``variant``-th run, see
    :func:`variants`) and validate the result."""
    spec, gold = inst.family.answer, inst.gold.answer
    if variant >= variants(inst, mutation):
        return Outcome(mutation, False, None)
    with inst.open() as ep:
        inner = ep.toolbox()
        edit = _edit(inst, mutation, variant)
        if edit is not None:
            box = _Mutating(inner, edit, target=0 if mutation != "skip_write" else _last_write(inst))
            text = inst.family.solve(box, inst.params, inst.now)
            return Outcome(mutation, True, ep.finish(text, calls=box.calls)) if box.applied else \
                Outcome(mutation, False, None)
        if mutation in ("hedged_answer", "equivalent_answer"):
            if spec is None or gold is None:
                return Outcome(mutation, False, None)
            inst.family.solve(inner, inst.params, inst.now)
            text = (_hedged if mutation == "hedged_answer" else _equivalent_answer)(spec, gold)
            return Outcome(mutation, True, ep.finish(text, calls=inner.calls))
        if mutation == "identical_update" and not inst.writes:
            return Outcome(mutation, False, None)
        text = inst.family.solve(inner, inst.params, inst.now)
        if mutation == "extra_write":
            inner.call("createResource", {"resourceType": "Basic", "body": {
                "resourceType": "Basic", "code": {"text": "unrelated note written by a careless agent"}}})
        elif mutation == "transient_write":
            made = inner.call("createResource", {"resourceType": "Basic", "body": {
                "resourceType": "Basic", "code": {"text": "scratch note, deleted right away"}}}).output or {}
            inner.call("deleteResource", {"resourceType": "Basic", "resourceId": made.get("id", "")})
        elif mutation == "identical_update":
            patient = _patient_of(inst)
            current = ep.client.read("Patient", patient).body if patient else None
            if not current:
                return Outcome(mutation, False, None)
            inner.call("updateResource", {"resourceType": "Patient", "resourceId": patient,
                                          "body": _reserialised({k: v for k, v in current.items() if k != "meta"}
                                                                | {"meta": current.get("meta", {})})})
        return Outcome(mutation, True, ep.finish(text, calls=inner.calls))


def _patient_of(inst: Instance) -> str | None:
    """The patient an instance is about (a resource the agent has every reason to read and rewrite)."""
    for key in ("patient_id", "pid"):
        if isinstance(inst.params.get(key), str):
            return inst.params[key]
    return None


def _last_write(inst: Instance) -> int:
    return max(0, sum(1 for c in inst.reference.calls if c.name in WRITES) - 1)
