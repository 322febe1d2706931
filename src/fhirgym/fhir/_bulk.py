"""Preparing resources for a bulk load, optionally in worker processes.

Validation and index extraction are pure Python and dominate a bulk load; SQLite inserts are cheap
by comparison. With ``workers > 1`` chunks are prepared in a process pool (each worker builds its own
validator and extractor once) while the parent only writes, which is how a load uses every core.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING

import orjson

from ._errors import FhirError, invalid_resource
from ._store import Record

if TYPE_CHECKING:
    from ._server import FhirServer

#: (position in input, resource, version) for every resource to store
Item = tuple[int, dict, int]

_WORKER: FhirServer | None = None


def _init_worker(base_url: str, validate: bool) -> None:
    global _WORKER
    from ._server import FhirServer, ServerConfig
    from ._store import Store

    _WORKER = FhirServer(Store(), config=ServerConfig(base_url=base_url, validate=validate))


def _prepare(server: FhirServer, items: list[Item], ts: str, validate: bool) -> list[Record] | tuple[int, list]:
    out = []
    for n, res, version in items:
        if validate:
            errors = [i for i in server.validator.validate(res) if i.severity in ("error", "fatal")]
            if errors:
                return n, errors
        rec = server._record(res["resourceType"], res["id"], version, "PUT", dict(res), ts)
        rec.body = orjson.dumps(rec.body)  # serialised here, so the parent only writes bytes
        out.append(rec)
    return out


def _prepare_in_worker(payload: bytes, ts: str, validate: bool) -> list[Record] | tuple[int, list]:
    assert _WORKER is not None
    items = [(n, res, v) for n, res, v in orjson.loads(payload)]
    return _prepare(_WORKER, items, ts, validate)


def prepared_records(server: FhirServer, items: list[Item], ts: str, validate: bool, workers: int,
                     chunk: int = 500) -> Iterator[list[Record]]:
    """Batches of ready-to-write records, in input order. Raises 422 on the first invalid resource."""
    chunks = [items[i : i + chunk] for i in range(0, len(items), chunk)]
    workers = min(workers, os.cpu_count() or 1, len(chunks))
    if workers <= 1:
        for c in chunks:
            yield _check(_prepare(server, c, ts, validate))
        return
    with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(server.config.base_url, validate)) as pool:
        futures = [pool.submit(_prepare_in_worker, orjson.dumps(c), ts, validate) for c in chunks]
        try:
            for f in futures:
                yield _check(f.result())
        finally:
            for f in futures:
                f.cancel()


def _check(result: list[Record] | tuple[int, list]) -> list[Record]:
    if isinstance(result, tuple):
        n, errors = result
        err = invalid_resource(errors)
        raise FhirError(err.status, f"resource #{n}: {err.diagnostics}", err.code, err.expression, issues=err.issues)
    return result


__all__ = ["prepared_records"]
