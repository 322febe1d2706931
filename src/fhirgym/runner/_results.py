"""Crash-safe result files: a run killed at any moment leaves no torn line and loses no finished episode.

Each finished episode writes its transcript first (temporary file + atomic rename), then appends one
JSON line to ``results.jsonl`` with a single ``write`` on an ``O_APPEND`` descriptor, followed by
``fsync``. A kill can at worst cut the last line short; readers drop such a tail, and ``--resume``
truncates it before appending, so the file stays one valid JSON object per line.

Lines that finish while an ``fsync`` is under way go out together, in one ``write`` and one ``fsync``
(group commit): an ``fsync`` takes milliseconds, and hundreds of episodes finish per second at scale.
Every caller returns once its own line is on disk.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import orjson

from .._gate import waiting
from ..fhir import json_default_str

RESULTS = "results.jsonl"
_writer = threading.Lock()  # held by the thread writing a batch
_queue = threading.Lock()
_pending: dict[Path, list[_Entry]] = {}


class _Entry:
    __slots__ = ("data", "done", "error")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.done = False
        self.error: BaseException | None = None


def read_results(out: Path, repair: bool = False) -> list[dict]:
    """Every complete line of ``out/results.jsonl``; with ``repair`` a torn tail is cut off the file."""
    path = Path(out) / RESULTS
    if not path.exists():
        return []
    data = path.read_bytes()
    lines: list[dict] = []
    good = 0
    for raw in data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n"):
        try:
            lines.append(orjson.loads(raw))
        except orjson.JSONDecodeError:
            break
        good += len(raw) + 1
    if repair and good < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(good)
    return lines


def append_result(out: Path, line: dict) -> None:
    """Append ``line`` to ``out/results.jsonl``; returns once it is on disk (with the lines of other
    threads that were waiting meanwhile)."""
    path = Path(out) / RESULTS
    entry = _Entry(orjson.dumps(line, default=json_default_str) + b"\n")
    with _queue:
        _pending.setdefault(path, []).append(entry)
    with waiting(), _writer:
        if not entry.done:
            with _queue:
                batch = _pending.pop(path, [])
            try:
                _write_all(path, b"".join(e.data for e in batch))
            except BaseException as exc:
                for e in batch:
                    e.error = exc
                raise
            finally:
                for e in batch:
                    e.done = True
    if entry.error is not None:
        raise OSError(f"appending to {path} failed: {entry.error}") from entry.error


def _write_all(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(orjson.dumps(payload, default=json_default_str, option=orjson.OPT_INDENT_2))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
