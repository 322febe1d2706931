"""The clinical families, one concept per module: allergies, conditional_orders, corrections, immunizations, labs, medications, patients, referrals, visits, vitals.

Importing the package registers them all (the entry point of ``fhirgym.tasks`` names it)."""

from . import (  # noqa: F401
    allergies,
    conditional_orders,
    corrections,
    immunizations,
    labs,
    medications,
    patients,
    referrals,
    visits,
    vitals,
)
