"""Row builders, one module per index kind: ``(value, out, code)`` appends the value's full rows.

Composite components pass ``code=None``; the code column is dropped when the component is serialised.
"""

from __future__ import annotations

from collections.abc import Callable

from ..fhirtypes import DATEISH, NUMERIC, QUANTITIES, STRINGISH, URIISH
from ..values import RefTypes
from .composite import component_json
from .date import d_period, d_prim, d_timing
from .number import n_num, n_quantity, n_range
from .quantity import q_money, q_quantity, q_range
from .reference import r_uri, reference_builders
from .string import s_address, s_name, s_prim
from .token import t_bool, t_cc, t_coding, t_contactpoint, t_identifier, t_int, t_prim
from .uri import u_uri

__all__ = ["builders", "component_json", "t_prim"]


def builders(ptype: str, refs: RefTypes, known: frozenset[str]) -> dict[str, Callable[..., None]]:
    """FHIR type -> row builder, for one search parameter type. Types absent here give no rows."""
    b: dict[str, Callable[..., None]] = {}
    if ptype == "string":
        b.update(dict.fromkeys(STRINGISH, s_prim), HumanName=s_name, Address=s_address)
    elif ptype == "token":
        b.update(dict.fromkeys(STRINGISH, t_prim))
        b.update(dict.fromkeys(("integer", "positiveInt", "unsignedInt"), t_int))
        b.update(
            boolean=t_bool,
            Coding=t_coding,
            CodeableConcept=t_cc,
            Identifier=t_identifier,
            ContactPoint=t_contactpoint,
        )
    elif ptype == "reference":
        r_reference, r_inline = reference_builders(refs, known)
        b.update(dict.fromkeys(URIISH, r_uri), Reference=r_reference)
        b.update(dict.fromkeys((*known, "Resource", "DomainResource"), r_inline))
    elif ptype == "date":
        b.update(dict.fromkeys(DATEISH, d_prim), Period=d_period, Timing=d_timing)
    elif ptype == "number":
        b.update(dict.fromkeys(NUMERIC, n_num), Range=n_range)
        b.update(dict.fromkeys(QUANTITIES, n_quantity))
    elif ptype == "quantity":
        b.update(dict.fromkeys(QUANTITIES, q_quantity), Money=q_money, Range=q_range)
    elif ptype == "uri":
        b.update(dict.fromkeys(URIISH | {"string"}, u_uri))
    return b
