"""Paraphrased prompts keep every entity and the answer format, are cached, and run like the original."""

from __future__ import annotations

import pytest

from fhirgym.tasks import TaskWorld, make_instance
from fhirgym.tasks._paraphrase import ParaphraseUnavailable, cached_paraphrase, entities, paraphrase


@pytest.fixture()
def inst(small_world_path, tmp_path, monkeypatch):
    monkeypatch.setattr("fhirgym.tasks._paraphrase.cache_dir", lambda: tmp_path)
    return make_instance("records.record_condition", 2, TaskWorld.open(small_world_path))


def test_a_faithful_paraphrase_is_accepted_cached_and_keeps_the_format(inst):
    body = inst.family.prompt(inst.params)
    name, born = inst.params["name"], body.split("born ")[1].split(")")[0]
    faithful = (f"Patient {name}, date of birth {born}, got a new diagnosis today: essential hypertension, SNOMED CT "
                f"{inst.params['code']}. Please add it as an active, confirmed condition, onset today.")
    calls: list = []
    new = paraphrase(inst, lambda m: calls.append(m) or faithful, "fake/model", 1)
    assert new.prompt.startswith(faithful) and new.prompt.endswith(inst.prompt[len(body):])
    assert new.paraphrase == 1 and new.prompt_id != inst.prompt_id and new.gold is inst.gold
    again = cached_paraphrase(inst, 1)
    assert again.prompt == new.prompt and len(calls) == 1


def test_paraphrases_that_lose_an_entity_are_rejected_and_retried(inst):
    body = inst.family.prompt(inst.params)
    assert inst.params["name"] in entities(body, inst.params) and inst.params["code"] in entities(body, inst.params)
    replies = iter(["Record hypertension for the patient.", body.replace(inst.params["code"], "12345"),
                    body.replace("diagnosed", "found to have")])
    new = paraphrase(inst, lambda m: next(replies), "fake/model", 2)
    assert "found to have" in new.prompt
    with pytest.raises(ParaphraseUnavailable, match="lost"):
        paraphrase(make_instance("records.record_condition", 3, inst.world), lambda m: "Something else.", "fake", 1)
    with pytest.raises(ParaphraseUnavailable, match="fhirgym tasks paraphrase"):
        cached_paraphrase(make_instance("records.record_condition", 4, inst.world), 1)


def test_a_paraphrased_instance_validates_like_the_original(inst):
    new = paraphrase(inst, lambda m: inst.family.prompt(inst.params).replace("Please record", "Kindly document"),
                     "fake/model", 1)
    with new.open() as ep:
        text = new.family.solve(ep.toolbox(), new.params, new.now)
        assert ep.finish(text).success
