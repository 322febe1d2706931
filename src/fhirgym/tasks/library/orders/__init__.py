"""The orders families, one concept per module: genetic_tests, surgery_plans.

Importing the package registers them all (the entry point of ``fhirgym.tasks`` names it)."""

from . import genetic_tests, surgery_plans  # noqa: F401
