"""The R4 specification as lookups: element definitions, search parameters, value sets, compartments.

Built once from HL7's ``hl7.fhir.r4.core`` package (see :mod:`._package`), then pickled into the cache
so later processes load it in a fraction of a second. Nothing here is written by hand: every type,
element, cardinality, binding and search parameter comes from the official JSON.
"""

from __future__ import annotations

import functools
import pickle
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ._package import SHA256, cache_dir, package_path

#: Bump when the derived model changes shape, so stale caches are rebuilt.
MODEL_VERSION = 3

_FHIR_TYPE_EXT = "http://hl7.org/fhir/StructureDefinition/structuredefinition-fhir-type"
_REGEX_EXT = "http://hl7.org/fhir/StructureDefinition/regex"
_SD_PREFIX = "http://hl7.org/fhir/StructureDefinition/"
#: Example search parameters shipped in the package that are not part of the specification proper.
_EXAMPLE_SEARCH_PARAMS = frozenset({"example", "example-reference", "example-extension"})


@dataclass(frozen=True, slots=True)
class ElementDef:
    """One element of a resource or datatype, as the snapshot defines it."""

    path: str  # e.g. "Observation.value[x]"
    name: str  # last path segment without "[x]", e.g. "value"
    min: int
    max: int | None  # None = unbounded ("*")
    types: tuple[str, ...]  # FHIR type codes ("Quantity", "string", "BackboneElement", ...)
    target_types: tuple[str, ...]  # Reference/canonical targets; () = any
    binding_strength: str | None
    binding_valueset: str | None  # canonical URL without version
    content_reference: str | None  # path whose children this element reuses
    is_choice: bool
    is_summary: bool
    is_modifier: bool

    @property
    def is_array(self) -> bool:
        return self.max is None or self.max > 1


@dataclass(frozen=True, slots=True)
class SearchParamComponent:
    definition: str  # canonical URL of the component's SearchParameter
    expression: str  # FHIRPath relative to the composite's expression


@dataclass(frozen=True, slots=True)
class SearchParam:
    """An official SearchParameter as it applies to one resource type."""

    id: str
    url: str
    code: str
    type: str  # number date string token reference composite quantity uri special
    expression: str | None
    base: tuple[str, ...]
    targets: tuple[str, ...]
    modifiers: tuple[str, ...]
    comparators: tuple[str, ...]
    components: tuple[SearchParamComponent, ...]
    description: str


@dataclass
class Spec:
    """Lookups over the official R4 definitions. Obtain it with :func:`load_spec`."""

    version: str
    resource_types: tuple[str, ...]  # the 146 concrete resource types, sorted
    abstract_resource_types: tuple[str, ...]  # Resource, DomainResource
    complex_types: tuple[str, ...]
    primitive_types: tuple[str, ...]
    elements: dict[str, ElementDef]  # full path -> definition (resources and datatypes)
    children: dict[str, dict[str, ElementDef]]  # parent path -> child name -> definition
    primitive_regex: dict[str, str]
    search_params_by_type: dict[str, dict[str, SearchParam]]  # resource type -> code -> param
    search_params_by_url: dict[str, SearchParam]
    valuesets: dict[str, dict]  # url -> ValueSet JSON
    codesystems: dict[str, dict]  # url -> CodeSystem JSON
    patient_compartment: dict[str, tuple[str, ...]]  # resource type -> param codes linking to Patient
    sd_files: dict[str, str]  # type name -> file name inside the package directory
    package_dir: str
    _expansions: dict[str, frozenset[tuple[str, str]] | None] = field(default_factory=dict)

    # -- types -----------------------------------------------------------------------------------
    def is_resource_type(self, name: str) -> bool:
        return name in self._resource_set

    @functools.cached_property
    def _resource_set(self) -> frozenset[str]:
        return frozenset(self.resource_types)

    def is_primitive(self, type_code: str) -> bool:
        return type_code in self.primitive_regex or type_code in self._primitive_set

    @functools.cached_property
    def _primitive_set(self) -> frozenset[str]:
        return frozenset(self.primitive_types)

    def child_elements(self, path: str) -> dict[str, ElementDef]:
        """Children of an element path, following datatypes and content references.

        ``path`` may be a resource type ("Patient"), a backbone path ("Patient.contact") or a
        datatype name ("HumanName").
        """
        own = self.children.get(path)
        if own is not None:
            return own
        el = self.elements.get(path)
        if el is None:
            return {}
        if el.content_reference:
            return self.child_elements(el.content_reference)
        if len(el.types) == 1 and el.types[0] not in ("BackboneElement", "Element"):
            return self.children.get(el.types[0], {})
        return {}

    def structure_definition(self, type_name: str) -> dict:
        """The official StructureDefinition JSON of a resource or datatype."""
        fname = self.sd_files.get(type_name)
        if fname is None:
            raise KeyError(type_name)
        return orjson.loads((Path(self.package_dir) / fname).read_bytes())

    # -- search parameters ----------------------------------------------------------------------
    def search_params(self, resource_type: str) -> dict[str, SearchParam]:
        """All parameters applicable to a type, including the Resource/DomainResource ones."""
        return self.search_params_by_type.get(resource_type, {})

    # -- terminology -------------------------------------------------------------------------------
    def valueset_codes(self, url: str) -> frozenset[tuple[str, str]] | None:
        """Expansion of a core ValueSet as (system, code) pairs; None if not enumerable here."""
        url = url.split("|", 1)[0]
        if url in self._expansions:
            return self._expansions[url]
        if url not in self.valuesets:  # not remembered: the URLs clients send are unbounded
            return None
        self._expansions[url] = None  # guards against include cycles
        result = self._expand(url)
        self._expansions[url] = result
        return result

    def _expand(self, url: str) -> frozenset[tuple[str, str]] | None:
        vs = self.valuesets.get(url)
        if vs is None:
            return None
        codes: set[tuple[str, str]] = set()
        compose = vs.get("compose")
        if not compose:
            contains = vs.get("expansion", {}).get("contains")
            if not contains:
                return None
            codes.update((c.get("system", ""), c["code"]) for c in _walk_contains(contains) if "code" in c)
            return frozenset(codes)
        if compose.get("exclude"):
            return None
        for inc in compose.get("include", []):
            part = self._expand_include(inc)
            if part is None:
                return None
            codes |= part
        return frozenset(codes)

    def _expand_include(self, inc: dict) -> set[tuple[str, str]] | None:
        sets: list[set[tuple[str, str]]] = []
        system = inc.get("system")
        if system:
            if inc.get("concept"):
                sets.append({(system, c["code"]) for c in inc["concept"]})
            elif inc.get("filter"):
                return None
            else:
                cs = self.codesystems.get(system)
                if cs is None or cs.get("content") not in (None, "complete"):
                    return None
                sets.append({(system, c["code"]) for c in _walk_concepts(cs.get("concept", []))})
        for vs_url in inc.get("valueSet", []):
            part = self.valueset_codes(vs_url)
            if part is None:
                return None
            sets.append(set(part))
        if not sets:
            return None
        result = sets[0]
        for s in sets[1:]:
            result &= s  # FHIR: system and valueSet in one include intersect
        return result


def _walk_concepts(concepts: Iterable[dict]) -> Iterator[dict]:
    for c in concepts:
        yield c
        yield from _walk_concepts(c.get("concept", []))


def _walk_contains(contains: Iterable[dict]) -> Iterator[dict]:
    for c in contains:
        yield c
        yield from _walk_contains(c.get("contains", []))


# ------------------------------------------------------------------------------------------------
# Building the model from the package
# ------------------------------------------------------------------------------------------------


def _type_code(t: dict) -> str:
    code = t["code"]
    if code.startswith("http://hl7.org/fhirpath/System."):
        for ext in t.get("extension", []):
            if ext.get("url") == _FHIR_TYPE_EXT:
                return ext.get("valueUrl") or ext.get("valueString") or code
        return code.rsplit(".", 1)[1].lower()
    return code


def _element(e: dict) -> ElementDef:
    path = e["path"]
    last = path.rsplit(".", 1)[-1]
    is_choice = last.endswith("[x]")
    types = tuple(_type_code(t) for t in e.get("type", []))
    targets: list[str] = []
    for t in e.get("type", []):
        for prof in t.get("targetProfile", []):
            if prof.startswith(_SD_PREFIX):
                name = prof[len(_SD_PREFIX) :]
                if name not in ("Resource", "DomainResource"):
                    targets.append(name)
    binding = e.get("binding") or {}
    max_raw = e.get("max", "*")
    cref = e.get("contentReference")
    return ElementDef(
        path=path,
        name=last[:-3] if is_choice else last,
        min=int(e.get("min", 0)),
        max=None if max_raw == "*" else int(max_raw),
        types=types,
        target_types=tuple(dict.fromkeys(targets)),
        binding_strength=binding.get("strength"),
        binding_valueset=(binding.get("valueSet") or "").split("|", 1)[0] or None,
        content_reference=cref[1:] if cref and cref.startswith("#") else cref,
        is_choice=is_choice,
        is_summary=bool(e.get("isSummary")),
        is_modifier=bool(e.get("isModifier")),
    )


def _iter_package(tgz: Path, dest: Path) -> Path:
    """Unpack the package once into the cache and return its ``package/`` directory."""
    marker = dest / ".complete"
    if not marker.exists():
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tgz) as tf:
            tf.extractall(dest, filter="data")
        marker.write_text(SHA256)
    return dest / "package"


def build_spec(package_dir: Path) -> Spec:
    """Parse the unpacked package into a :class:`Spec` (slow path; cached by :func:`load_spec`)."""
    sds: list[tuple[str, dict]] = []
    sps: list[dict] = []
    valuesets: dict[str, dict] = {}
    codesystems: dict[str, dict] = {}
    compartment: dict[str, tuple[str, ...]] = {}
    version = ""
    for f in sorted(package_dir.iterdir()):
        name = f.name
        if not name.endswith(".json") or name.startswith("."):
            continue
        prefix = name.split("-", 1)[0]
        if prefix not in ("StructureDefinition", "SearchParameter", "ValueSet", "CodeSystem") and name != (
            "CompartmentDefinition-patient.json"
        ) and name != "package.json":
            continue
        data = orjson.loads(f.read_bytes())
        if name == "package.json":
            version = data.get("version", "")
        elif prefix == "StructureDefinition":
            sds.append((name, data))
        elif prefix == "SearchParameter":
            sps.append(data)
        elif prefix == "ValueSet":
            valuesets[data["url"]] = data
        elif prefix == "CodeSystem":
            codesystems[data["url"]] = data
        else:
            for r in data.get("resource", []):
                if r.get("param"):
                    compartment[r["code"]] = tuple(r["param"])

    resource_types: list[str] = []
    abstract: list[str] = []
    complex_types: list[str] = []
    primitive_types: list[str] = []
    elements: dict[str, ElementDef] = {}
    children: dict[str, dict[str, ElementDef]] = {}
    primitive_regex: dict[str, str] = {}
    sd_files: dict[str, str] = {}
    for fname, sd in sds:
        if sd.get("derivation") == "constraint" or sd.get("kind") == "logical":
            continue  # profiles and logical models are not base types
        tname = sd["type"]
        sd_files[tname] = fname
        kind = sd["kind"]
        if kind == "resource":
            (abstract if sd.get("abstract") else resource_types).append(tname)
        elif kind == "complex-type":
            if not sd.get("abstract"):
                complex_types.append(tname)
        elif kind == "primitive-type":
            primitive_types.append(tname)
        for e in sd["snapshot"]["element"]:
            el = _element(e)
            elements[el.path] = el
            if "." in el.path:
                parent = el.path.rsplit(".", 1)[0]
                children.setdefault(parent, {})[el.name] = el
            if kind == "primitive-type" and el.path == f"{tname}.value":
                for t in e.get("type", []):
                    for ext in t.get("extension", []):
                        if ext.get("url") == _REGEX_EXT:
                            primitive_regex[tname] = ext["valueString"]
    resource_set = set(resource_types)

    by_type: dict[str, dict[str, SearchParam]] = {t: {} for t in resource_types}
    by_url: dict[str, SearchParam] = {}
    for sp in sorted(sps, key=lambda s: s["id"]):
        if sp["id"] in _EXAMPLE_SEARCH_PARAMS or "base" not in sp:
            continue
        param = SearchParam(
            id=sp["id"],
            url=sp["url"],
            code=sp["code"],
            type=sp["type"],
            expression=sp.get("expression"),
            base=tuple(sp["base"]),
            targets=tuple(sp.get("target", [])),
            modifiers=tuple(sp.get("modifier", [])),
            comparators=tuple(sp.get("comparator", [])),
            components=tuple(
                SearchParamComponent(c["definition"], c["expression"]) for c in sp.get("component", [])
            ),
            description=sp.get("description", ""),
        )
        by_url[param.url] = param
        for base in param.base:
            applies = resource_types if base in ("Resource", "DomainResource") else [base]
            for rt in applies:
                if rt in resource_set:
                    if base == "DomainResource" and rt in ("Bundle", "Parameters", "Binary"):
                        continue
                    by_type[rt][param.code] = param

    return Spec(
        version=version,
        resource_types=tuple(sorted(resource_types)),
        abstract_resource_types=tuple(sorted(abstract)),
        complex_types=tuple(sorted(complex_types)),
        primitive_types=tuple(sorted(primitive_types)),
        elements=elements,
        children=children,
        primitive_regex=primitive_regex,
        search_params_by_type=by_type,
        search_params_by_url=by_url,
        valuesets=valuesets,
        codesystems=codesystems,
        patient_compartment=compartment,
        sd_files=sd_files,
        package_dir=str(package_dir),
    )


@functools.lru_cache(maxsize=1)
def load_spec() -> Spec:
    """The R4 specification, obtained and parsed on first use, then loaded from the cache."""
    tgz = package_path()
    root = cache_dir()
    package_dir = _iter_package(tgz, root / "hl7.fhir.r4.core-4.0.1")
    pickled = root / f"spec-model-v{MODEL_VERSION}-{SHA256[:12]}.pickle"
    if pickled.is_file():
        try:
            spec = pickle.loads(pickled.read_bytes())
            if isinstance(spec, Spec) and Path(spec.package_dir).is_dir():
                return spec
        except Exception:  # a stale or truncated cache is rebuilt, never trusted
            pass
    spec = build_spec(package_dir)
    tmp = pickled.with_suffix(".part")
    tmp.write_bytes(pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL))
    tmp.replace(pickled)
    return spec
