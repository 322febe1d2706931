"""The built-in task families: one package per category (records, billing, scheduling, orders, clinical),
one concept per module. Each package is an entry point of the ``fhirgym.tasks`` group (pyproject.toml),
written with the public authoring kit of :mod:`fhirgym.tasks` only."""
