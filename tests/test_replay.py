"""REST behaviour is pinned: a recorded corpus of requests replays with byte-identical responses.

The corpus (``tests/data/replay_corpus.jsonl.gz``) was recorded by ``python tests/_replay.py`` at
commit 6116f48, before the server was split into modules; re-record it only for an intended change
of behaviour, and say so in the commit.
"""

from __future__ import annotations

from _replay import compare, recorded, replay


def test_the_corpus_covers_every_interaction_and_many_errors():
    records = recorded()
    assert len(records) >= 400
    statuses = {r["status"] for r in records}
    assert {200, 201, 204, 304, 400, 404, 405, 409, 410, 412, 413, 415, 422} <= statuses
    requests = " ".join(r["request"] for r in records)
    for marker in ("_history", "$validate", "$everything", "_getpages", "_search", "metadata", "if-none-exist", "if-match"):
        assert marker in requests, marker
    assert sum(r["request"] == "POST /" or r["request"].startswith("POST / ") for r in records) >= 30  # bundles


def test_every_recorded_response_replays_byte_for_byte():
    differences: list[str] = []
    assert compare(recorded(), list(replay()), differences.append) == 0, "\n".join(differences[:20])
