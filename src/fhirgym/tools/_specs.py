"""FHIR R4 specification tools: what a resource or datatype holds and how it is searched.

The four spec tools of FHIR-AgentEval's MCP server, answered from HL7's official
definitions (:mod:`fhirgym.spec`) only, so an agent never sees a hand-written approximation. Answers
are compact (one small object per element or parameter; the boilerplate every element allows is left
out) and bounded by the context budget: what does not fit is counted in ``omitted`` and the answer says
how to get it (``next_offset``, or a ``path`` to look at one part).
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from ..fhir import json_default_str
from ..spec import Spec, load_spec
from ._core import Tool, ToolContext, ToolError

#: Room kept for the wrapper fields (description, note, next_offset) when fitting a list to the budget.
_RESERVE = 700
#: A required binding's codes are listed when the value set has at most this many.
_MAX_CODES = 12
_DESC_CHARS = 90
_DIGEST_VERSION = 1
_SD_PREFIX = "http://hl7.org/fhir/StructureDefinition/"
#: Allowed on every element; listing them for each one would crowd out what is specific.
_BOILERPLATE = ("extension", "modifierExtension")

#: How values of each parameter type are written (FHIR R4 search page, §3.1.1.4-5), once per answer.
SEARCH_HINTS: dict[str, str] = {
    "string": "matches the start, case- and accent-insensitive; :exact, :contains; :missing=true|false",
    "token": "system|code, code or |code (identifiers: system|value); :not, :text, :in, :not-in; :missing",
    "reference": "Type/id or id; :Type for one target type; chain as param.otherParam=value "
                 "(e.g. subject.family=Diaz); :identifier=system|value; :missing",
    "date": "prefix + date/dateTime: eq ne gt lt ge le sa eb ap (e.g. ge2025-06-01, lt2025-06-02T12:00); "
            "repeat the parameter for a range; :missing",
    "number": "prefix + number: eq ne gt lt ge le sa eb ap (e.g. gt5); :missing",
    "quantity": "prefix + value|system|code (e.g. gt5.4|http://unitsofmeasure.org|mg); :missing",
    "uri": "exact URI; :below, :above; :missing",
    "composite": "component values joined by $ (e.g. code-value-quantity=http://loinc.org|8480-6$gt140)",
    "special": "defined by the parameter itself (see description)",
}
#: Result parameters (not SearchParameters, so not in the definitions) an agent needs to shape results.
RESULT_PARAMETERS = ("_count, _sort (-desc), _include (Type:param), _revinclude, _summary (count, true), "
                     "_elements, _total")


# ------------------------------------------------------------------------------------------------
# Shared helpers
# ------------------------------------------------------------------------------------------------


def _size(obj: Any) -> int:
    return len(orjson.dumps(obj, default=json_default_str))


def _suggest(name: str, candidates: Iterable[str], what: str, how: str) -> ToolError:
    """An unknown-name error naming the closest candidates, so one retry fixes a typo or wrong case."""
    pool = list(candidates)
    lower = {c.lower(): c for c in pool}
    close = [lower[m] for m in difflib.get_close_matches(name.lower(), list(lower), n=5, cutoff=0.6)]
    close += [c for c in pool if name and name.lower() in c.lower() and c not in close][: 5 - len(close)]
    hint = f"; did you mean: {', '.join(close)}?" if close else f"; {how}"
    return ToolError(f"unknown {what} {name!r}{hint}")


def _offset(args: dict) -> int:
    raw = args.get("offset") or 0
    if raw < 0:
        raise ToolError("offset must be >= 0")
    return int(raw)


def _page(items: list[dict], offset: int, budget: int, head: dict) -> tuple[list[dict], int | None]:
    """Items from ``offset`` while the answer (``head`` + items) fits ``budget``; the next offset if cut.

    At least one item is returned so paging always progresses, even under an unreasonably small budget.
    """
    used = _size(head) + _RESERVE
    kept: list[dict] = []
    for n in range(offset, len(items)):
        used += _size(items[n]) + 1
        if used > budget and kept:
            return kept, n
        kept.append(items[n])
    return kept, None


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[: limit - 1].rsplit(" ", 1)[0].rstrip(",;:") + "…"


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    return re.split(r"(?<=[a-z)\]][.!?])\s", text, maxsplit=1)[0]


def _type_description(sd: dict) -> str:
    desc = sd.get("description") or ""
    return re.sub(r"^Base StructureDefinition for \S+ Type:\s*", "", desc.strip())


# ------------------------------------------------------------------------------------------------
# listResources
# ------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _resource_digest(package_dir: str) -> dict[str, str]:
    """Resource type -> one-line description. Reading 146 StructureDefinitions takes ~0.5 s, so the
    digest is written once next to the unpacked package and read from there afterwards."""
    path = Path(package_dir).parent / f"spec-tools-resources-v{_DIGEST_VERSION}.json"
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        pass
    spec = load_spec()
    digest = {rt: _cut(_first_sentence(_type_description(spec.structure_definition(rt))), _DESC_CHARS)
              for rt in spec.resource_types}
    try:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.part")  # concurrent builders never share a file
        tmp.write_bytes(orjson.dumps(digest))
        tmp.replace(path)
    except OSError:  # a read-only cache only costs the next process the 0.5 s again
        pass
    return digest


def list_resources(ctx: ToolContext, args: dict) -> dict:
    spec = load_spec()
    digest = _resource_digest(spec.package_dir)
    query = (args.get("query") or "").strip().lower()
    names = [rt for rt in spec.resource_types
             if not query or query in rt.lower() or query in digest.get(rt, "").lower()]
    items = [{rt: digest.get(rt, "")} for rt in names]  # sized as they appear in the answer's map
    head: dict[str, Any] = {"fhirVersion": spec.version, "count": len(items)}
    kept, next_offset = _page(items, _offset(args), ctx.budget, head)
    out = {**head, "resources": {k: v for i in kept for k, v in i.items()}}
    if next_offset is not None:
        out["omitted"] = len(items) - next_offset
        out["next_offset"] = next_offset
        out["note"] = (f"{out['omitted']} resource types left out to fit the output budget; call again with "
                       f"offset={next_offset}, or pass query to filter by name or description")
    if query and not items:
        out["note"] = f"no resource type matches {query!r}; call without query for the full list"
    return out


# ------------------------------------------------------------------------------------------------
# getStructureDefinition / getDataTypeDefinition
# ------------------------------------------------------------------------------------------------


def _types(raw: dict, normalised: tuple[str, ...]) -> str:
    """FHIR notation: ``Reference(Patient | Group)``, ``boolean | dateTime``, ``canonical(ValueSet)``."""
    out = []
    for t, code in zip(raw.get("type", []), normalised, strict=True):
        targets = [p[len(_SD_PREFIX):] for p in t.get("targetProfile", []) if p.startswith(_SD_PREFIX)]
        out.append(f"{code}({' | '.join(targets)})" if targets else code)
    return " | ".join(out)


def _binding(spec: Spec, strength: str | None, url: str | None) -> dict | None:
    """Required bindings with their codes when few (what validation enforces); extensible ones by name."""
    if not url or strength not in ("required", "extensible"):
        return None
    vs = spec.valuesets.get(url) or {}
    out: dict[str, Any] = {"strength": strength, "valueSet": vs.get("name") or url.rsplit("/", 1)[-1]}
    if strength == "required":
        codes = spec.valueset_codes(url)
        if codes is not None and len(codes) <= _MAX_CODES:
            out["codes"] = sorted({c for _, c in codes})
        elif codes is not None:
            out["codeCount"] = len(codes)
            out["url"] = url
        else:
            out["url"] = url
    return out


def _keep(path: str, root: str, is_resource: bool) -> bool:
    parts = path.split(".")
    if parts[-1] in _BOILERPLATE:
        return False
    # element ids (``Patient.contact.id``, ``HumanName.id``) are internal; a resource's own id is not
    return not (parts[-1] == "id" and not (is_resource and len(parts) == 2 and parts[0] == root))


def _element(spec: Spec, raw: dict) -> dict:
    path = raw["path"]
    el = spec.elements.get(path)
    mx = raw.get("max", "*")
    item: dict[str, Any] = {"path": path, "card": f"{raw.get('min', 0)}..{mx}"}
    if raw.get("contentReference"):
        item["type"] = f"see {raw['contentReference'].lstrip('#')}"
    elif el is not None and el.types:
        item["type"] = _types(raw, el.types)
    if raw.get("short"):
        item["short"] = _cut(raw["short"], 160)
    if raw.get("isModifier"):
        item["modifier"] = True
    if el is not None and (b := _binding(spec, el.binding_strength, el.binding_valueset)):
        item["binding"] = b
    return item


@functools.lru_cache(maxsize=64)
def _definition(name: str) -> tuple[dict, tuple[dict, ...]]:
    """(root info, compact elements) of one StructureDefinition; cached, as agents ask again."""
    spec = load_spec()
    sd = spec.structure_definition(name)
    is_resource = sd.get("kind") == "resource"
    elements = tuple(_element(spec, e) for e in sd["snapshot"]["element"][1:]
                     if _keep(e["path"], name, is_resource))
    info = {"kind": sd.get("kind"), "abstract": bool(sd.get("abstract")),
            "description": _cut(_type_description(sd), 400), "url": sd.get("url")}
    if sd.get("baseDefinition"):
        info["base"] = sd["baseDefinition"].rsplit("/", 1)[-1]
    if sd.get("kind") == "primitive-type":
        info["regex"] = spec.primitive_regex.get(name)
    return info, elements


def _resolve_type(spec: Spec, name: str, resources: bool) -> str:
    if name in spec.sd_files:
        return name
    pool = spec.resource_types if resources else (*spec.complex_types, *spec.primitive_types)
    if resources:
        how = "listResources gives the resource types"
    else:
        how = f"data types are: {', '.join((*spec.complex_types, *spec.primitive_types))}"
    raise _suggest(name, pool, "resource type" if resources else "data type", how)


def _describe(ctx: ToolContext, args: dict, name: str, key: str, resources: bool) -> dict:
    spec = load_spec()
    tname = _resolve_type(spec, name, resources)
    info, elements = _definition(tname)
    items = list(elements)
    path = (args.get("path") or "").strip()
    if path:
        full = path if path.split(".")[0] == tname else f"{tname}.{path}"
        if not any(e["path"] == full for e in elements) and any(e["path"] == full + "[x]" for e in elements):
            full += "[x]"  # 'Observation.value' names the choice element 'Observation.value[x]'
        items = [e for e in elements if e["path"] == full or e["path"].startswith(full + ".")]
        if not items:
            raise _suggest(full, [e["path"] for e in elements], f"element of {tname}",
                           f"call without path to list the elements of {tname}")
    head: dict[str, Any] = {key: tname, **{k: v for k, v in info.items() if v not in (None, False)}}
    if path:
        head["path"] = full
    head["elementCount"] = len(items)
    kept, next_offset = _page(items, _offset(args), ctx.budget, head)
    out = {**head, "elements": kept}
    notes = ["extension, modifierExtension and element ids (allowed on every element) are not listed"]
    if next_offset is not None:
        out["omitted"] = len(items) - next_offset
        out["next_offset"] = next_offset
        parts = list(dict.fromkeys(".".join(e["path"].split(".")[:2]) for e in items[next_offset:]))
        notes.insert(0, f"{out['omitted']} elements left out to fit the output budget; call again with "
                        f"offset={next_offset}, or pass path (e.g. {parts[0]!r}) to see one part")
    complex_used = sorted({t for e in kept for t in re.findall(r"[A-Z]\w+", e.get("type", ""))
                           if t in spec.complex_types and t not in ("Reference", "BackboneElement")})
    if complex_used:
        notes.append(f"data types ({', '.join(complex_used[:6])}) are described by getDataTypeDefinition")
    out["note"] = "; ".join(notes)
    return out


def get_structure_definition(ctx: ToolContext, args: dict) -> dict:
    return _describe(ctx, args, args["resourceType"], "resourceType", resources=True)


def get_data_type_definition(ctx: ToolContext, args: dict) -> dict:
    return _describe(ctx, args, args["dataType"], "dataType", resources=False)


# ------------------------------------------------------------------------------------------------
# getSearchParams
# ------------------------------------------------------------------------------------------------


def _split_top(expr: str) -> list[str]:
    """``a | b.where(x | y)`` -> ``['a', 'b.where(x | y)']``: union branches outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "|" and depth == 0:
            parts.append(expr[start:i].strip())
            start = i + 1
    parts.append(expr[start:].strip())
    return [p for p in parts if p]


def _own_expression(expr: str | None, rtype: str) -> str | None:
    """The branches of a multi-resource expression that apply to ``rtype``."""
    if not expr:
        return None
    parts = _split_top(expr)
    mine = [p for p in parts if re.match(rf"^\(?{rtype}\b", p)]
    return " | ".join(mine) if mine else expr


def _own_description(desc: str, rtype: str) -> str:
    """The line of a "Multiple Resources" description that is about ``rtype``."""
    if desc.startswith("Multiple Resources"):
        m = re.search(rf"^\* \[{rtype}\]\([^)]*\): (.*)$", desc, re.MULTILINE)
        if m:
            desc = m.group(1)
    desc = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", desc)  # markdown links -> their text
    return _cut(desc, 220)


def _param(spec: Spec, p: Any, rtype: str) -> dict:
    item: dict[str, Any] = {"code": p.code, "type": p.type}
    expr = _own_expression(p.expression, rtype)
    if expr:
        item["expression"] = _cut(expr, 240)
    item["description"] = _own_description(p.description, rtype)
    if p.targets:
        item["targets"] = list(p.targets)
    if p.components:
        item["components"] = [getattr(spec.search_params_by_url.get(c.definition), "code", c.definition)
                              for c in p.components]
    if p.modifiers:
        item["modifiers"] = list(p.modifiers)
    return item


def get_search_params(ctx: ToolContext, args: dict) -> dict:
    spec = load_spec()
    rtype = args["resourceType"]
    if not spec.is_resource_type(rtype):
        raise _suggest(rtype, spec.resource_types, "resource type", "listResources gives the resource types")
    params = spec.search_params(rtype)
    code = (args.get("code") or "").strip()
    ptype = (args.get("type") or "").strip()
    if ptype and ptype not in SEARCH_HINTS:
        raise ToolError(f"unknown search parameter type {ptype!r}; types are: {', '.join(SEARCH_HINTS)}")
    if code:
        if code not in params:
            raise _suggest(code, params, f"search parameter of {rtype}",
                           f"call getSearchParams without code to list those of {rtype}")
        chosen = [params[code]]
    else:
        chosen = [p for p in params.values() if not ptype or p.type == ptype]
    common = {p.code: p.type for p in chosen if not code and set(p.base) & {"Resource", "DomainResource"}}
    own = sorted((p for p in chosen if p.code not in common), key=lambda p: p.code)
    items = [_param(spec, p, rtype) for p in own]
    head: dict[str, Any] = {"resourceType": rtype, "count": len(items)}
    used_types = sorted({p.type for p in chosen})
    head["value_syntax"] = {t: SEARCH_HINTS[t] for t in used_types if t in SEARCH_HINTS}
    if common:
        head["common"] = common
    if not code:
        head["result_parameters"] = RESULT_PARAMETERS
    kept, next_offset = _page(items, _offset(args), ctx.budget, head)
    out = {**head, "params": kept}
    if next_offset is not None:
        out["omitted"] = len(items) - next_offset
        out["next_offset"] = next_offset
        out["note"] = (f"{out['omitted']} parameters left out to fit the output budget; call again with "
                       f"offset={next_offset}, or pass code or type to narrow")
    elif common:
        out["note"] = "'common' parameters apply to every resource type; pass code for one's definition"
    if not items and not common:
        out["note"] = (f"no {ptype} search parameter on {rtype}" if ptype
                       else f"{rtype} has no search parameters")
    return out


# ------------------------------------------------------------------------------------------------
# Tool definitions
# ------------------------------------------------------------------------------------------------

_OFFSET = {"type": "integer", "description": "continue a cut answer from its next_offset (default 0)"}
_PATH = {"type": "string", "description": "only this element and its children, e.g. 'Patient.contact'"}

LIST_RESOURCES = Tool(
    "listResources",
    "List the FHIR R4 resource types with a one-line description each (official definitions). "
    "query filters by name or description, e.g. 'schedul' or 'billing'.",
    {"type": "object", "properties": {
        "query": {"type": "string", "description": "case-insensitive text to filter by"},
        "offset": _OFFSET}},
    list_resources, group="specs")

GET_STRUCTURE_DEFINITION = Tool(
    "getStructureDefinition",
    "The elements of a FHIR R4 resource type from its official StructureDefinition: path, cardinality "
    "(min..max), types (Reference targets in parentheses), short description, and bindings (required "
    "ones with their codes when few). Use it before creating or updating a resource.",
    {"type": "object", "properties": {
        "resourceType": {"type": "string", "description": "FHIR resource type, e.g. Patient, Appointment"},
        "path": _PATH, "offset": _OFFSET},
     "required": ["resourceType"]},
    get_structure_definition, group="specs")

GET_SEARCH_PARAMS = Tool(
    "getSearchParams",
    "The official FHIR R4 search parameters of a resource type: code, type, FHIRPath expression, "
    "description, reference targets, and how values of each type are written (prefixes, modifiers). "
    "code gives one parameter; type (string, token, reference, date, number, quantity, uri, composite, "
    "special) filters.",
    {"type": "object", "properties": {
        "resourceType": {"type": "string", "description": "FHIR resource type, e.g. Slot"},
        "code": {"type": "string", "description": "one search parameter code, e.g. 'schedule'"},
        "type": {"type": "string", "description": "only parameters of this type, e.g. 'reference'"},
        "offset": _OFFSET},
     "required": ["resourceType"]},
    get_search_params, group="specs")

GET_DATA_TYPE_DEFINITION = Tool(
    "getDataTypeDefinition",
    "The definition of a FHIR R4 data type (e.g. HumanName, CodeableConcept, Reference, Period, "
    "dateTime): its elements like getStructureDefinition, or for a primitive type its format (regex).",
    {"type": "object", "properties": {
        "dataType": {"type": "string", "description": "data type name, e.g. HumanName or dateTime"},
        "path": {"type": "string", "description": "only this element and its children"},
        "offset": _OFFSET},
     "required": ["dataType"]},
    get_data_type_definition, group="specs")

SPEC_TOOLS: tuple[Tool, ...] = (LIST_RESOURCES, GET_STRUCTURE_DEFINITION, GET_SEARCH_PARAMS,
                                GET_DATA_TYPE_DEFINITION)
