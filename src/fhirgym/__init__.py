"""fhirgym: evaluate and train LLM agents on HL7 FHIR R4 work in an embedded, resettable server.

The names a user starts from are importable from here (``from fhirgym import make_instance, Episode``);
each loads its layer on first use, so ``import fhirgym`` (and the command line's start) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: name → the layer that defines it
_FACE = {
    "TaskWorld": "fhirgym.tasks",
    "make_instance": "fhirgym.tasks",
    "families": "fhirgym.tasks",
    "Family": "fhirgym.tasks",
    "register": "fhirgym.tasks",
    "Episode": "fhirgym.env",
    "Config": "fhirgym.env",
    "register_config": "fhirgym.env",
    "make_agent": "fhirgym.agents",
    "make_backend": "fhirgym.agents",
    "run_eval": "fhirgym.runner",
    "EvalSpec": "fhirgym.runner",
    "FhirServer": "fhirgym.fhir",
    "Store": "fhirgym.fhir",
}

__all__ = ["__version__", *_FACE]


def __getattr__(name: str) -> Any:
    if name in _FACE:
        value = getattr(importlib.import_module(_FACE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fhirgym' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
