"""Write docs/CLI.md from the command line's own ``--help`` (``--check``: exit 1 when the page is stale).

The reference is generated, never written by hand, so it cannot drift from the options the code takes;
``tests/test_docs.py`` runs the check.
"""

from __future__ import annotations

from pathlib import Path

import click
from _generated import write_or_check

from fhirgym.cli import main

PAGE = Path(__file__).resolve().parents[1] / "docs" / "CLI.md"
WIDTH = 100


def _walk(command: click.Command, parent: click.Context | None, name: str):
    ctx = click.Context(command, info_name=name, parent=parent, max_content_width=WIDTH, terminal_width=WIDTH)
    yield ctx
    if isinstance(command, click.Group):
        for sub in command.list_commands(ctx):
            child = command.get_command(ctx, sub)
            if child is not None and not child.hidden:
                yield from _walk(child, ctx, sub)


def reference() -> str:
    """The page: a table of contents, then every command's help as ``--help`` prints it."""
    contexts = list(_walk(main, None, "fhirgym"))
    lines = ["# Command-line reference", "",
             "Generated from `fhirgym … --help` by `python scripts/cli_reference.py`; do not edit by hand.", ""]
    lines += [f"- [`{c.command_path}`](#{c.command_path.replace(' ', '-')})" for c in contexts]
    for c in contexts:
        lines += ["", f'<a id="{c.command_path.replace(" ", "-")}"></a>', "", f"## `{c.command_path}`", "",
                  "```text", c.get_help().rstrip(), "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    write_or_check(PAGE, reference(), "cli_reference.py")
