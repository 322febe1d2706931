"""The ``fhirgym`` group that every command module adds its commands to."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="fhirgym")
def main() -> None:
    """Evaluate and train LLM agents on HL7 FHIR R4 work in an embedded, resettable FHIR server."""
