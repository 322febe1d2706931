"""The state change of an episode: what was created, updated and deleted between two points.

Built from the store's layer (:meth:`Store.layer_versions`): the pre-run state is the world base plus
the task's setup layer, so everything an episode writes lands in the layer and the diff costs what the
episode wrote. A resource created and deleted again within the episode is no net change.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from ..fhir import Store

Mark = dict[tuple[str, str], tuple[int, bool]]


@dataclass(frozen=True)
class Change:
    op: str  # create | update | delete
    rtype: str
    id: str
    before: dict | None
    after: dict | None

    @property
    def key(self) -> str:
        return f"{self.rtype}/{self.id}"

    def to_json(self) -> dict:
        return {"op": self.op, "type": self.rtype, "id": self.id, "before": self.before, "after": self.after}


def mark(store: Store) -> Mark:
    """The store's state marker, to diff against later."""
    return store.layer_versions()


def _body(store: Store, rtype: str, rid: str, version: int) -> dict | None:
    row = store.version(rtype, rid, version)
    return orjson.loads(row[2]) if row and row[2] else None


def diff(store: Store, since: Mark) -> list[Change]:
    """Changes of ``store`` since ``since`` (sorted by type and id, for stable reports)."""
    out: list[Change] = []
    for (rtype, rid), (version, deleted) in sorted(store.layer_versions().items()):
        prior = since.get((rtype, rid))
        if prior == (version, deleted):
            continue
        if prior is not None:
            before = None if prior[1] else _body(store, rtype, rid, prior[0])
        else:
            base = store.base_version(rtype, rid)
            before = orjson.loads(base[1]) if base and base[1] else None
        after = None if deleted else _body(store, rtype, rid, version)
        if before is None and after is None:
            continue
        op = "create" if before is None else "delete" if after is None else "update"
        out.append(Change(op, rtype, rid, before, after))
    return out
