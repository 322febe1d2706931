"""The records families, one concept per module: conditions, family_history, patients.

Importing the package registers them all (the entry point of ``fhirgym.tasks`` names it)."""

from . import conditions, family_history, patients  # noqa: F401
