"""The built-in task families, one module per category; importing this package registers them."""

from . import appointments, billing, clinical, orders, records, scheduling  # noqa: F401
