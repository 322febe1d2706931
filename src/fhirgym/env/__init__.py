"""The episode seam: every consumer (runner, memory, RL) drives task instances through it.

    from fhirgym.env import Episode
    with Episode(instance, "specs") as ep:         # fork ~1 ms, frozen clock, the config's tools
        obs = ep.reset()                            # prompt, now, instructions, tool schemas
        call = ep.step({"name": "searchResources", "arguments": {"resourceType": "Patient"}})
        verdict = ep.submit("<answer>...</answer>"); ep.reward()  # strict / light on the final state; 1.0 or 0.0

An agent is given ``ep.tools`` (:class:`AgentTools`) and nothing else of the episode. Configurations are an open
registry (:func:`register_config`, or the ``fhirgym.configs`` entry-point group; docs/EVALUATION.md).
"""

from ._config import BASELINE, CODEACT, SPECS, Config, UnknownConfig, configs, get_config, register_config
from ._episode import AgentTools, Episode, EpisodeStateError, Observation, solve_reference

__all__ = [
    "BASELINE",
    "CODEACT",
    "SPECS",
    "AgentTools",
    "Config",
    "Episode",
    "EpisodeStateError",
    "Observation",
    "UnknownConfig",
    "configs",
    "get_config",
    "register_config",
    "solve_reference",
]
