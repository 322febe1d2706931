"""Every family has at least three phrasings written by us that keep every entity of its prompt."""

from __future__ import annotations

import pytest

from fhirgym.tasks import (
    TaskWorld,
    families,
    make_instance,
    offline_paraphrase,
    paraphrase_source,
    written_paraphrase,
    written_phrasings,
)
from fhirgym.tasks._paraphrase import missing_entities


@pytest.fixture(scope="module")
def world(small_world_path):
    return TaskWorld.open(small_world_path)


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


def test_written_paraphrase_keeps_the_answer_format_and_records_its_source(world):
    inst = make_instance("records.find_patient", 0, world)
    assert paraphrase_source(inst) == "template"
    for k in (1, 2, 3):
        new = written_paraphrase(inst, k)
        assert new.prompt != inst.prompt and new.paraphrase == k and paraphrase_source(new) == "written"
        assert new.prompt.endswith(inst.prompt[len(inst.family.prompt(inst.params).strip()):])
        assert new.gold.answer == inst.gold.answer
    assert paraphrase_source(offline_paraphrase(inst, 2, model="no-such-model")) == "written"
