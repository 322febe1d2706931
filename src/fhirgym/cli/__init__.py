"""The ``fhirgym`` command line: one module per command group, each command a thin call into the library
(docs/CLI.md is generated from its ``--help``)."""

from . import evaluation, experiment, mcp, memory, qa, report, rl, serve, tasks, world  # noqa: F401  (each adds its commands to main)
from ._group import main

__all__ = ["main"]
