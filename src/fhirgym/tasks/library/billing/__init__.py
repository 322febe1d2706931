"""The billing families, one concept per module: accounts, coverage, guarantors, related_persons.

Importing the package registers them all (the entry point of ``fhirgym.tasks`` names it)."""

from . import accounts, coverage, guarantors, related_persons  # noqa: F401
