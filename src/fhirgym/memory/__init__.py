"""Reflexion long-term memory (docs/MEMORY.md): training, the de-identified lesson store, serving it to
agents (tools or prompt), the memory configurations of Table 1, and the experiment matrix in one command.

    from fhirgym.memory import TrainSpec, train_memory, bind
    store = train_memory(TrainSpec(out=Path("mem"), tasks="scheduling", model="openai/gpt-4.1-mini"), world)
    config = bind("memory", "mem")          # fhirgym eval --config memory --memory mem
"""

from ._deid import deidentify, sensitive_values
from ._embed import EMBEDDERS, Embedder, get_embedder
from ._reflect import Malformed, evaluate, reflect, run_digest
from ._serve import MEMORY_CONFIGS, MODES, bind, bound_config, prompt_block
from ._show import describe
from ._store import Lesson, MemoryStore, MemoryStoreError, open_frozen
from ._train import TrainSpec, train_memory

__all__ = [
    "EMBEDDERS",
    "MEMORY_CONFIGS",
    "MODES",
    "Embedder",
    "Lesson",
    "Malformed",
    "MemoryStore",
    "MemoryStoreError",
    "TrainSpec",
    "bind",
    "bound_config",
    "deidentify",
    "describe",
    "evaluate",
    "get_embedder",
    "open_frozen",
    "prompt_block",
    "reflect",
    "run_digest",
    "sensitive_values",
    "train_memory",
]
