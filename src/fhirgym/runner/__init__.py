"""Episodes and evaluation runs: forking, running an agent, validating, crash-safe result files.

    from fhirgym.runner import EvalSpec, run_eval
    results = run_eval(EvalSpec(out=Path("runs/x"), agent="reference", tasks="scheduling"), world)
"""

from ._dispatch import Recipe, RunError
from ._episode import DEFAULT_MAX_STEPS, EpisodeKey, run_episode, verdict_fields
from ._eval import (
    EvalError,
    EvalSpec,
    episode_pool,
    instance_for,
    instance_seed,
    plan,
    progress_line,
    run_eval,
    summary,
)
from ._judge import Agreement, JudgeVerdict, LlmJudge, agreement, gold_text
from ._results import RESULTS, append_result, read_results

__all__ = [
    "DEFAULT_MAX_STEPS",
    "RESULTS",
    "Agreement",
    "EpisodeKey",
    "EvalError",
    "EvalSpec",
    "JudgeVerdict",
    "LlmJudge",
    "Recipe",
    "RunError",
    "agreement",
    "append_result",
    "episode_pool",
    "gold_text",
    "instance_for",
    "instance_seed",
    "plan",
    "progress_line",
    "read_results",
    "run_episode",
    "run_eval",
    "summary",
    "verdict_fields",
]
