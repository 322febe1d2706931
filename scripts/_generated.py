"""Shared by the scripts that generate a docs page: write it, or with ``--check`` exit 1 when it is stale."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(page: Path, text: str, script: str) -> None:
    if "--check" in sys.argv[1:]:
        if not page.is_file() or page.read_text() != text:
            sys.exit(f"{page} is stale: run python scripts/{script}")
    else:
        page.write_text(text)
        print(f"{page}: {len(text):,} characters")
