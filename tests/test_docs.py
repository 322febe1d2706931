"""The documentation stays a set of references: every file a page links or names ships in the repository,
the README stays a hub, and the library's docstrings say what code does, not which issue asked for it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
#: repository paths written in prose or code spans (``docs/X.md``, ``bench/x.py``…); other projects' files
#: are named with their project ("llama.cpp's llama-adapter.cpp"), never as a bare repository path
_PATH = re.compile(r"(?<![\w/.-])((?:docs|bench|scripts|plans|tests|src|examples)/[\w./-]*\w)")
_LABEL = re.compile(r"\b(?:[Ii]ssue|[Rr]equirement)s? #?\d+")
#: the team's working papers, which do not ship: the library and the reference pages never cite them
_PRIVATE = re.compile(r"\b(?:ANCHORS|MEASUREMENTS|PACKAGES|ECOSYSTEM-2026|CODE-REVIEW(?:-T3)?|STYLE|QA-AND-RL-FACTS)\.md")


def dangling(page: Path) -> list[str]:
    """The links and repository paths of ``page`` that name nothing in the checkout."""
    text = page.read_text()
    out = [t for t in _LINK.findall(text) if not re.match(r"[a-z]+:", t) and not (page.parent / t).exists()]
    for path in _PATH.findall(text):
        path = path.rstrip(".")
        if not any(c in path for c in "*{}<") and not (ROOT / path).exists() and not (page.parent / path).exists():
            out.append(path)
    return out


def test_no_page_links_or_names_a_file_that_does_not_ship():
    found = {str(p.relative_to(ROOT)): d for p in PAGES if (d := dangling(p))}
    assert found == {}


def test_the_checker_sees_a_dangling_link_and_a_dangling_path(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("See [the guide](missing.md), docs/NOPE.md and [a site](https://example.org).\n")
    assert dangling(page) == ["missing.md", "docs/NOPE.md"]


def test_the_readme_is_a_hub():
    text = (ROOT / "README.md").read_text()
    assert len(text) <= 10_000, len(text)
    assert text.index("bash scripts/eval.sh") < text.index("bash scripts/test.sh") < text.index("\n## ")


def test_the_library_names_no_issue_or_requirement_and_no_working_paper():
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in sorted((ROOT / "src").rglob("*")) if p.suffix in {".py", ".json", ".toml", ".md"}
             for n, line in enumerate(p.read_text().splitlines(), 1) if _LABEL.search(line) or _PRIVATE.search(line)]
    pages = [f"{p.relative_to(ROOT)}:{n}" for p in PAGES if "notes" not in p.parts
             for n, line in enumerate(p.read_text().splitlines(), 1) if _PRIVATE.search(line)]
    assert found == [] and pages == []


def test_module_headers_say_why_in_ten_lines_at_most():
    import ast

    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "src").rglob("*.py"))
            if (doc := ast.get_docstring(ast.parse(p.read_text()), clean=False))
            and (n := len(doc.strip("\n").splitlines())) > 10}
    assert long == {}


@pytest.mark.parametrize("script", ["cli_reference.py", "families_reference.py"])
def test_generated_references_are_current(script):
    """docs/CLI.md is what ``--help`` prints, docs/FAMILIES.md what the registry holds."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--check"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
