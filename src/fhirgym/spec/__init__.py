"""Official HL7 FHIR R4 (4.0.1) definitions: obtaining the package and looking things up in it.

This is the only layer that reads HL7's package; every other layer asks it.
"""

from . import codes
from ._model import ElementDef, SearchParam, SearchParamComponent, Spec, build_spec, load_spec
from ._package import SpecUnavailable, cache_dir, file_sha256, package_path

__all__ = [
    "ElementDef",
    "SearchParam",
    "SearchParamComponent",
    "Spec",
    "SpecUnavailable",
    "build_spec",
    "cache_dir",
    "codes",
    "file_sha256",
    "load_spec",
    "package_path",
]
