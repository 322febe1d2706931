"""Reflexion long-term memory (docs/MEMORY.md): training, the de-identified lesson store, serving it to
agents (tools or prompt), the memory configurations of Table 1, and the experiment matrix in one command.

    from fhirgym.memory import TrainSpec, train_memory, bind
    store = train_memory(TrainSpec(out=Path("mem"), tasks="scheduling", model="openai/gpt-4.1-mini"), world)
    config = bind("memory", "mem")          # fhirgym eval --config memory --memory mem
"""

from ._deid import deidentify, sensitive_values
from ._embed import EMBEDDERS, Embedder, get_embedder
from ._estimate import MEASURED, STATED, EstimateError, Figures, FigureTable, load_prices, measured_figures
from ._experiment import (
    CONFIGS,
    ExperimentError,
    Plan,
    estimate,
    load_plan,
    run_experiment,
    write_experiment_report,
)
from ._reflect import (
    CRITIQUE_SCHEMA,
    Malformed,
    evaluate,
    lesson_problem,
    lessons_schema,
    reflect,
    run_digest,
)
from ._serve import MEMORY_CONFIGS, MODES, bind, bound_config, prompt_block
from ._settings import SETTINGS, SettingError, SettingPlan, heldout_split, plan_setting
from ._show import describe
from ._store import Lesson, MemoryStore, MemoryStoreError, open_frozen
from ._train import TrainSpec, train_memory

__all__ = [
    "CONFIGS",
    "CRITIQUE_SCHEMA",
    "EMBEDDERS",
    "MEASURED",
    "MEMORY_CONFIGS",
    "MODES",
    "SETTINGS",
    "STATED",
    "Embedder",
    "EstimateError",
    "ExperimentError",
    "FigureTable",
    "Figures",
    "Lesson",
    "Malformed",
    "MemoryStore",
    "MemoryStoreError",
    "Plan",
    "SettingError",
    "SettingPlan",
    "TrainSpec",
    "bind",
    "bound_config",
    "deidentify",
    "describe",
    "estimate",
    "evaluate",
    "get_embedder",
    "heldout_split",
    "lesson_problem",
    "lessons_schema",
    "load_plan",
    "load_prices",
    "measured_figures",
    "open_frozen",
    "plan_setting",
    "prompt_block",
    "reflect",
    "run_digest",
    "run_experiment",
    "sensitive_values",
    "train_memory",
    "write_experiment_report",
]
