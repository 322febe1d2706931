"""docs/TASKS.md stays true: its complete example family passes `fhirgym tasks check` loaded with
--families, and an installed package's entry point adds families to every command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).parents[1] / "docs" / "TASKS.md"
FHIRGYM = [sys.executable, "-m", "fhirgym.cli"]


def example() -> str:
    found = re.findall(r'```python title="my_families.py"\n(.*?)```', DOC.read_text(), re.S)
    assert len(found) == 1, "docs/TASKS.md needs exactly one block titled my_families.py"
    return found[0]


def _run(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*FHIRGYM, *args], cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=600)


def test_the_documented_family_passes_tasks_check(tmp_path, small_world_path):
    (tmp_path / "my_families.py").write_text(example())
    done = _run(["tasks", "check", "--families", "my_families", "--seeds", "3"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 families × 3 seeds = 3 instances" in done.stdout
    assert "reference: strict 3/3 (100.0 %)" in done.stdout and "null:      strict 0/3" in done.stdout
    applied = re.search(r"mutations: (\d+)/(\d+) rejected", done.stdout)
    assert applied and applied[1] == applied[2] and int(applied[2]) >= 9, done.stdout


def test_an_installed_package_adds_families_through_the_entry_point(tmp_path, small_world_path):
    site = tmp_path / "site"
    (site / "acme_tasks-0.1.dist-info").mkdir(parents=True)
    (site / "acme_tasks.py").write_text(example())
    (site / "acme_tasks-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-tasks\n"
                                                               "Version: 0.1\n")
    (site / "acme_tasks-0.1.dist-info" / "entry_points.txt").write_text("[fhirgym.tasks]\nacme = acme_tasks\n")
    env = {"PYTHONPATH": str(site)}
    listed = _run(["tasks", "list", "--tasks", "records.*"], tmp_path, env)
    assert listed.returncode == 0, listed.stderr
    assert "records.example_body_height" in listed.stdout and "records.find_patient" in listed.stdout
    shown = _run(["tasks", "show", "records.example_body_height", "--seed", "1"], tmp_path, env)
    assert shown.returncode == 0 and '"writes": true' in shown.stdout, shown.stderr
    alone = _run(["tasks", "list"], tmp_path)  # not installed: not there
    assert "records.example_body_height" not in alone.stdout


def test_a_module_that_is_not_there_or_holds_no_family_is_refused(tmp_path):
    (tmp_path / "empty_mod.py").write_text("X = 1\n")
    for name, why in (("no_such_module", "cannot import"), ("empty_mod", "registers no task family")):
        done = _run(["tasks", "list", "--families", name], tmp_path)
        assert done.returncode == 2 and why in done.stderr, done.stderr


def test_the_built_in_library_uses_only_the_public_kit():
    """Every built-in family module imports public names of the kit only (no `_module`, no `_name`): what an
    outside author has is what the library has. Within a category's package a module may use the package's
    own shared helpers (its `_common` modules), never another family module."""
    import ast

    import fhirgym.tasks.library as library

    paths = sorted(Path(library.__file__).parent.rglob("*.py"))
    assert len([p for p in paths if not p.name.startswith("_")]) >= 20, "the library's family modules moved"
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                continue
            if node.level == 1:
                assert (node.module or "").startswith("_") or path.name == "__init__.py", (
                    f"{path.name} imports the family module {node.module}")
                continue
            parts = (node.module or "").split(".")
            assert not any(p.startswith("_") for p in parts if p), f"{path.name} imports {node.module}"
            assert not any(a.name.startswith("_") for a in node.names), f"{path.name}: {node.module}"
