"""fhirgym: evaluate and train LLM agents on HL7 FHIR R4 work in an embedded, resettable server."""

__version__ = "0.1.0"
