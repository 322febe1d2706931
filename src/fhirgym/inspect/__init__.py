"""fhirgym inside inspect-ai (``pip install 'fhirgym[inspect]'``; docs/INSPECT.md).

    inspect eval fhirgym/action --model fhirgym/reference -T tasks=records.* -T seeds=2   # then: inspect view
    inspect eval fhirgym/qa -T split=valid --model openai/gpt-4.1-mini
    inspect eval fhirgym/action -T config=codeact --solver fhirgym/codeact --model ...

Tasks ``fhirgym/action`` and ``fhirgym/qa`` (one :class:`~fhirgym.env.Episode` per sample, scored on its verdict),
solvers ``fhirgym/react`` and ``fhirgym/codeact`` (inspect's ``react()`` is the default), models ``fhirgym/reference``,
``fhirgym/nothing-found`` and ``fhirgym/local-<model>``, and the sandbox type ``fhirgym-bwrap``. The layer uses ``env``,
``tools``, ``agents``, ``tasks`` and ``runner``; nothing below imports it, and importing it needs the extra.
"""

try:
    import inspect_ai  # noqa: F401
except ImportError as exc:  # the base install has no inspect-ai: say how to get it
    raise ImportError("fhirgym.inspect needs inspect-ai: pip install 'fhirgym[inspect]'") from exc

from ._episodes import EpisodeHandle, episode_tools, handle_of
from ._models import FhirgymModel
from ._sandbox import BwrapConfig, BwrapSandboxEnvironment
from ._solvers import InspectBackend, default_agent, episode, fhirgym_codeact, fhirgym_react
from ._tasks import action, qa, verdict

__all__ = [
    "BwrapConfig",
    "BwrapSandboxEnvironment",
    "EpisodeHandle",
    "FhirgymModel",
    "InspectBackend",
    "action",
    "default_agent",
    "episode",
    "episode_tools",
    "fhirgym_codeact",
    "fhirgym_react",
    "handle_of",
    "qa",
    "verdict",
]
