"""The tracks as values: one definition that the CLI, the runner and RL agree on."""

import pytest

from fhirgym._defaults import TRACK_NAMES
from fhirgym.rl import ENV_CLASSES
from fhirgym.rl._curriculum import constant_names
from fhirgym.runner import EvalError, EvalSpec, plan
from fhirgym.tasks import ACTION, NOT_FOUND, QA, TRACKS, get_family, get_track, parse_answer
from fhirgym.tasks.qa import final_answer, says_no_answer


def test_the_cli_offers_exactly_the_defined_tracks_with_action_first():
    assert tuple(TRACKS) == TRACK_NAMES and TRACKS[TRACK_NAMES[0]] is ACTION
    assert ENV_CLASSES == {"action": "fhirgym-action", "qa": "fhirgym-qa"}


def test_each_track_s_negative_reply_is_what_its_scorer_reads_as_a_negative():
    assert parse_answer(ACTION.negative, get_family("records.find_patient").answer) is NOT_FOUND
    assert says_no_answer(final_answer(QA.negative))
    assert constant_names("qa") == ("no-answer", "no-answer after a look", "guess")
    assert constant_names("action") == ("nothing-found", "nothing-found after a look", "guess")


def test_an_unknown_track_is_refused_by_name_everywhere(tmp_path):
    with pytest.raises(ValueError, match="unknown track 'fhir'; use action or qa"):
        get_track("fhir")
    assert get_track(QA) is QA
    with pytest.raises(EvalError, match="--track: unknown track 'fhir'"):
        plan(EvalSpec(out=tmp_path, track="fhir"))
