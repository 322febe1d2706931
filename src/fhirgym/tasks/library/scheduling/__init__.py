"""The scheduling families, one concept per module: booking, cancelling, free_slots, rescheduling, slot_counts, waitlist, who_booked.

Importing the package registers them all (the entry point of ``fhirgym.tasks`` names it)."""

from . import booking, cancelling, free_slots, rescheduling, slot_counts, waitlist, who_booked  # noqa: F401
