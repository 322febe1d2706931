"""Write docs/FAMILIES.md from the task registry (``--check``: exit 1 when the page is stale).

Generated, so the list of families, their difficulty, what they read and write and which side of the
held-out split they are on cannot drift from the code; ``tests/test_docs.py`` runs the check.
"""

from __future__ import annotations

from pathlib import Path

from _generated import write_or_check

from fhirgym.tasks import families, heldout_split

PAGE = Path(__file__).resolve().parents[1] / "docs" / "FAMILIES.md"


def reference() -> str:
    fams = families()
    side = {f: s for s in ("train", "eval") for f in heldout_split()[s]}
    lines = ["# Task families", "",
             "Generated from the registry by `python scripts/families_reference.py`; do not edit by hand. "
             "R/W: reads, writes, or either (a conditional order decides per instance). v: the family's "
             "version (docs/TASKS.md). Split: the side of "
             "the shipped held-out split (docs/TRAINING.md, \"Splits that keep evaluation honest\").", ""]
    by_category: dict[str, list] = {}
    for f in fams:
        by_category.setdefault(f.category, []).append(f)
    writes = sum(f.writes for f in fams)
    lines += [f"{len(fams)} families in {len(by_category)} categories, {writes} of them writing.", ""]
    for category, members in by_category.items():
        lines += [f"## {category} ({len(members)})", "",
                  "| family | what it asks | d | R/W | resource types | split | v |", "|---|---|---:|---|---|---|---:|"]
        for f in sorted(members, key=lambda f: f.id):
            title = f.title.replace("|", "\\|")
            lines.append(f"| `{f.id}` | {title} | {f.difficulty} | {f.access()} | {', '.join(f.resource_types)} | "
                         f"{side.get(f.id, '–')} | {f.version} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    write_or_check(PAGE, reference(), "families_reference.py")
