"""Crash-safe result files: a run killed at any moment leaves no torn line and loses no finished episode.

Each finished episode writes its transcript first (temporary file + atomic rename), then appends one
JSON line to ``results.jsonl`` with a single ``write`` on an ``O_APPEND`` descriptor, followed by
``fsync``. A kill can at worst cut the last line short; readers drop such a tail, and ``--resume``
truncates it before appending, so the file stays one valid JSON object per line.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import orjson

from ..fhir import json_default_str

RESULTS = "results.jsonl"
_lock = threading.Lock()


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
    data = orjson.dumps(line, default=json_default_str) + b"\n"
    with _lock:
        fd = os.open(Path(out) / RESULTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
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
