"""A family's version is held to what it does, travels into results, and a family reads as a declaration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from fhirgym.runner import EvalError, EvalSpec, run_eval
from fhirgym.tasks import Family, TaskWorld, families, get_family, register
from fhirgym.tasks._family import _REGISTRY
from fhirgym.tasks._versions import family_digest, version_problems

ROOT = Path(__file__).resolve().parents[1]


def test_no_family_changed_without_a_version_bump():
    """scripts/family_versions.py --check: every family's digest and version as recorded."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "family_versions.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_changed_prompt_changes_the_digest_and_is_caught_until_the_version_moves(small_world_path, monkeypatch):
    world = TaskWorld.open(small_world_path)
    fam = get_family("records.find_patient")
    before = {"world_sha256": "w", "seeds": [0], "families": {fam.id: {"version": 1,
                                                                      "digest": family_digest(fam, [0], world)}}}
    monkeypatch.setattr(type(fam), "prompt", lambda self, params: f"Find {params['name']}, please.")
    changed = family_digest(fam, [0], world)
    assert changed != before["families"][fam.id]["digest"]
    now = {**before, "families": {fam.id: {"version": 1, "digest": changed}}}
    assert version_problems(before, now) == ([f"{fam.id}: changed without a version bump (still version 1)"], [])
    bumped = {**before, "families": {fam.id: {"version": 2, "digest": changed}}}
    assert version_problems(before, bumped) == ([], [f"{fam.id}: version 1 -> 2, not recorded yet"])
    assert version_problems(before, before) == ([], [])
    assert version_problems({**before, "seeds": [1]}, before)[1] == ["the record was made on another world or other seeds"]


def test_result_lines_and_run_json_carry_the_version_and_resume_refuses_another(small_world_path, tmp_path,
                                                                                 monkeypatch):
    world = TaskWorld.open(small_world_path)
    spec = EvalSpec(out=tmp_path, agent="reference", tasks="records.find_patient", seeds=[0, 1])
    lines = run_eval(spec, world)
    assert [line["task_version"] for line in lines] == [1, 1]
    assert orjson.loads((tmp_path / "run.json").read_bytes())["task_versions"] == {"records.find_patient": 1}
    monkeypatch.setattr(type(get_family("records.find_patient")), "version", 2)
    with pytest.raises(EvalError, match=r"changed version since it started \{'records.find_patient': \(1, 2\)\}"):
        run_eval(EvalSpec(out=tmp_path, agent="reference", tasks="records.find_patient", seeds=[0, 1, 2],
                          resume=True), world)


def test_a_family_declared_in_the_decorator_gets_its_header_from_it():
    answer = get_family("records.find_patient").answer
    declare = register("billing.decl_demo", difficulty=2, version=3, touches=["Patient"],
                       sequences=[["searchResources"]])
    try:
        class Demo(Family):
            """Say whether the patient exists.

            More text that is not the title."""

            __module__ = "fhirgym.tasks.library.billing.coverage"  # as if written in the billing package
            answer = get_family("records.find_patient").answer

        declare(Demo)
        assert (Demo.id, Demo.category, Demo.difficulty, Demo.version, Demo.writes) == (
            "billing.decl_demo", "billing", 2, 3, False)
        assert Demo.title == "Say whether the patient exists."
        assert Demo.resource_types == ("Patient",) and Demo.sequences == (("searchResources",),)
        assert get_family("billing.decl_demo").id == "billing.decl_demo"

        class Outside(Family):
            """An outside author's family, in a module named for no category."""

            answer = get_family("records.find_patient").answer

        with pytest.raises(TypeError, match="no category given"):
            register("outside.demo", difficulty=1, touches=("Patient",), sequences=(("searchResources",),))(Outside)
        register("outside.demo", difficulty=1, touches=("Patient",), sequences=(("searchResources",),),
                 category="records")(Outside)
        assert Outside.category == "records" and Outside.version == 1
        with pytest.raises(TypeError, match="version must be a whole number"):
            register("outside.bad", difficulty=1, version=0, category="records", touches=("Patient",),
                     sequences=(("searchResources",),))(type("Bad", (Family,), {"answer": answer}))
    finally:
        for task_id in ("billing.decl_demo", "outside.demo", "outside.bad"):
            _REGISTRY.pop(task_id, None)
    assert not {"billing.decl_demo", "outside.demo"} & {f.id for f in families()}
