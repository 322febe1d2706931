"""The state change of an episode: what was created, updated and deleted between two points.

Built from the store's layer (:meth:`Store.layer_versions`): the pre-run state is the world base plus
the task's setup layer, so everything an episode writes lands in the layer and the diff costs what the
episode wrote.

Two rulings (docs/TASKS.md): an update whose content equals the before-state by FHIR type (only the
server-managed ``meta.versionId``/``meta.lastUpdated`` may differ) is *no* change; a resource created and
deleted again inside the episode *is* one (op ``transient``): the server's history keeps it, so a
read-only task that wrote a scratch resource wrote, and strict validation counts it as collateral.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from ..fhir import Store

Mark = dict[tuple[str, str], tuple[int, bool]]


@dataclass(frozen=True)
class Change:
    op: str  # create | update | delete | transient (created and deleted again)
    rtype: str
    id: str
    before: dict | None
    after: dict | None

    @property
    def key(self) -> str:
        return f"{self.rtype}/{self.id}"

    def to_json(self) -> dict:
        return {"op": self.op, "type": self.rtype, "id": self.id, "before": self.before, "after": self.after}


#: ``meta`` elements the server manages: the only content an update may change without changing anything.
SERVER_MANAGED_META = frozenset({"versionId", "lastUpdated"})

_MOMENT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:\d{2})$")


def _moment(text: str) -> datetime | None:
    """A dateTime/instant with a time and a zone as a moment (``Z`` and ``+00:00`` alike); else None."""
    if not _MOMENT.match(text):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def fhir_equal(a: Any, b: Any) -> bool:
    """Equality by FHIR type: instants as moments, decimals as numbers, codes and strings as strings.

    JSON gives no types, so the forms decide: two strings that are both zoned date-times compare as
    moments; numbers compare by value (``5`` = ``5.0``) but never equal a boolean; objects by their keys.
    """
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(fhir_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(fhir_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, str) and isinstance(b, str) and a != b:
        ma = _moment(a)
        return ma is not None and ma == _moment(b)
    return type(a) is type(b) and a == b


def content(resource: dict) -> dict:
    """A resource without the server-managed ``meta`` elements (an emptied ``meta`` dropped)."""
    meta = resource.get("meta")
    if not isinstance(meta, dict) or not SERVER_MANAGED_META & meta.keys():
        return resource
    rest = {k: v for k, v in meta.items() if k not in SERVER_MANAGED_META}
    out = {k: v for k, v in resource.items() if k != "meta"}
    if rest:
        out["meta"] = rest
    return out


def same_content(before: dict, after: dict) -> bool:
    """An update that changed nothing the client controls (it is not a change)."""
    return fhir_equal(content(before), content(after))


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
        if before is None and after is None:  # created (again) and deleted inside the episode
            first = (prior[0] if prior else 0) + 1
            written = next((b for v in range(version - 1, first - 1, -1) if (b := _body(store, rtype, rid, v))), None)
            out.append(Change("transient", rtype, rid, None, written))
            continue
        if before is not None and after is not None and same_content(before, after):
            continue
        op = "create" if before is None else "delete" if after is None else "update"
        out.append(Change(op, rtype, rid, before, after))
    return out
