"""FHIR type names the walkers, the row builders and the fallback agree on."""

from __future__ import annotations

SYSTEM_TYPES = {
    "String": "string",
    "Boolean": "boolean",
    "Integer": "integer",
    "Decimal": "decimal",
    "Date": "date",
    "DateTime": "dateTime",
    "Time": "time",
}
STRINGISH = frozenset(
    {"string", "markdown", "code", "id", "uri", "url", "canonical", "oid", "uuid", "base64Binary", "xhtml"}
)
URIISH = frozenset({"uri", "url", "canonical", "oid", "uuid"})
DATEISH = frozenset({"date", "dateTime", "instant"})
NUMERIC = frozenset({"decimal", "integer", "positiveInt", "unsignedInt", "integer64"})
QUANTITIES = frozenset(
    {"Quantity", "Age", "Duration", "Distance", "Count", "SimpleQuantity", "MoneyQuantity"}
)
QUANTITY_PARENTS = {t: "Quantity" for t in QUANTITIES if t != "Quantity"}
ABSTRACT = ("Resource", "DomainResource")
