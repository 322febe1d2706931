"""Every family has at least three phrasings written for it by us that keep every entity of its prompt."""

from __future__ import annotations

import dataclasses
import string

import pytest

from fhirgym.tasks import (
    ParaphraseUnavailable,
    TaskWorld,
    families,
    family_phrasings,
    make_instance,
    offline_paraphrase,
    paraphrase_source,
    written_paraphrase,
    written_phrasings,
)
from fhirgym.tasks._paraphrase import _norm, family_variants, missing_entities, phrasings, slot_pattern

SEEDS = range(5)
#: branches of a prompt that seeds 0-9 of the small world never draw, reached by changing the params
BRANCHES = {"billing.create_account": [{"payers": ["Aetna", "Medicare"]}]}


@pytest.fixture(scope="module")
def world(small_world_path):
    return TaskWorld.open(small_world_path)


def _ours():
    """The families fhirgym itself ships (not ones loaded from other packages' entry points)."""
    return [f for f in families() if type(f).__module__.startswith("fhirgym.")]


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def _variant(inst, body: str) -> int:
    """The index of the variant of ``inst``'s family that phrases ``body``."""
    return next(i for i, v in enumerate(family_variants(inst.task_id))
                if "prompt" not in v or slot_pattern(v["prompt"]).fullmatch(body))


def test_every_family_has_three_written_phrasings_that_keep_every_entity(world):
    bad = []
    for fam in families():
        for seed in (0, 1):
            inst = make_instance(fam.id, seed, world)
            body = fam.prompt(inst.params).strip()
            options = written_phrasings(inst)
            good = [t for t in options if not missing_entities(body, t, inst.params) and t.strip() != body]
            if len(good) < 3:
                bad.append((fam.id, seed, [missing_entities(body, t, inst.params) for t in options]))
    assert not bad, bad[:3]


def test_every_family_has_three_own_phrasings_that_keep_every_entity_and_differ(world):
    assert len(_ours()) >= 65
    bad = []
    for fam in _ours():
        for seed in SEEDS:
            inst = make_instance(fam.id, seed, world)
            body = fam.prompt(inst.params).strip()
            own = family_phrasings(inst)
            if len(own) < 3 or len({_norm(t) for t in own}) < len(own):
                bad.append((fam.id, seed, f"{len(own)} distinct phrasings"))
            for k, text in enumerate(own, 1):
                lost = missing_entities(body, text, inst.params)
                if lost or _norm(text) == _norm(body) or not text[:1].isupper() or "{" in text:
                    bad.append((fam.id, seed, k, lost, text))
    assert not bad, bad[:3]


def test_phrasings_use_only_fields_the_prompt_shows(world):
    """A field is a slot read out of the prompt or a param whose value the prompt shows: nothing leaks."""
    bad = []
    for fam in _ours():
        for seed in SEEDS:
            inst = make_instance(fam.id, seed, world)
            body = fam.prompt(inst.params).strip()
            variant = family_variants(fam.id)[_variant(inst, body)]
            slots = _fields(variant.get("prompt", ""))
            for text in variant["phrasings"]:
                for name in _fields(text) - slots:
                    if name not in inst.params:
                        bad.append((fam.id, name, "is neither a slot nor a param"))
                    elif _norm(str(inst.params[name])) not in _norm(body):
                        bad.append((fam.id, seed, name, "is a param the prompt does not show"))
    assert not bad, bad[:3]


def test_every_variant_of_a_family_is_reached_and_keeps_every_entity(world):
    bad = []
    for fam in _ours():
        reached = set()
        for seed in range(10):
            inst = make_instance(fam.id, seed, world)
            cases = [inst] + [dataclasses.replace(inst, params={**inst.params, **p}) for p in BRANCHES.get(fam.id, [])]
            for case in cases:
                body = fam.prompt(case.params).strip()
                reached.add(_variant(case, body))
                if any(missing_entities(body, t, case.params) for t in family_phrasings(case)):
                    bad.append((fam.id, seed, body))
        unused = [v.get("prompt") for i, v in enumerate(family_variants(fam.id)) if i not in reached]
        if unused:
            bad.append((fam.id, "variant never reached", unused))
    assert not bad, bad[:3]


def test_phrasings_name_only_known_families():
    known = {f.id for f in families()}
    entries = phrasings()["families"]
    assert set(entries) <= known, set(entries) - known
    for fid, entry in entries.items():
        if isinstance(entry, str):  # an alias: a family with the same prompt
            assert isinstance(entries.get(entry), list), (fid, entry)
        for variant in family_variants(fid):
            assert len(variant["phrasings"]) >= 3, fid


def test_a_prompt_no_variant_matches_is_a_clear_error(world, monkeypatch):
    inst = make_instance("records.find_patient", 0, world)
    monkeypatch.setattr(type(inst.family), "prompt", lambda self, params: "Reworded by a later change.")
    with pytest.raises(ParaphraseUnavailable, match=r"records\.find_patient"):
        family_phrasings(inst)


def test_a_family_without_its_own_phrasings_falls_back_to_the_generic_ones(world, monkeypatch):
    inst = make_instance("records.find_patient", 0, world)
    assert len(written_phrasings(inst)) == len(family_phrasings(inst)) + len(phrasings()["generic"])
    monkeypatch.delitem(phrasings()["families"], "records.find_patient")
    monkeypatch.delitem(phrasings()["families"], "records.patient_not_found")
    assert family_phrasings(inst) == []
    assert len(written_phrasings(inst)) == len(phrasings()["generic"]) == 3
    assert paraphrase_source(written_paraphrase(inst, 1)) == "written"


def test_written_paraphrase_keeps_the_answer_format_and_records_its_source(world):
    inst = make_instance("records.find_patient", 0, world)
    assert paraphrase_source(inst) == "template"
    own = family_phrasings(inst)
    for k in (1, 2, 3):
        new = written_paraphrase(inst, k)
        assert new.prompt != inst.prompt and new.paraphrase == k and paraphrase_source(new) == "written"
        assert new.prompt.startswith(own[k - 1])
        assert new.prompt.endswith(inst.prompt[len(inst.family.prompt(inst.params).strip()):])
        assert new.gold.answer == inst.gold.answer
    assert paraphrase_source(offline_paraphrase(inst, 2, model="no-such-model")) == "written"
