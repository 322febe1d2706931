"""The built-in task families, one module per category; each is an entry point of the ``fhirgym.tasks``
group (pyproject.toml) and written with the public authoring kit of :mod:`fhirgym.tasks` only."""
