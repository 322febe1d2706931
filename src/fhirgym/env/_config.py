"""Configurations: what an episode grants an agent (tools, system-prompt additions, hooks), by name.

The registry is open: a layer above (memory, a user's package) registers its own configurations with
:func:`register_config`, or ships them through the ``fhirgym.configs`` entry-point group, whose
targets are loaded the first time an unknown name is asked for. ``baseline``, ``read``, ``specs`` and
``codeact`` are registered here because they only need the tools layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from ..tasks import Instance
from ..tools import CODEACT_TOOLS, FHIR_TOOLS, SPEC_TOOLS, Tool


class UnknownConfig(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Config:
    """A named configuration of episodes.

    ``tools``: the tools an agent may call. ``system_suffix``: text added to the agent's system prompt.
    ``prepare(instance) -> str``: per-episode system-prompt addition (e.g. memory lessons for this task),
    called before the agent starts and never given the gold. ``after(episode)``: called once the
    episode has its verdict (e.g. a reflection step); it may read the transcript and the verdict.
    ``labels`` go into run.json (``labels.memory`` also into every result line).
    """

    name: str
    tools: tuple[Tool, ...]
    description: str = ""
    system_suffix: str = ""
    prepare: Callable[[Instance], str] | None = None
    after: Callable[[Any], None] | None = None  # gets the Episode
    labels: dict[str, str] = field(default_factory=dict)  # recorded in run.json (e.g. a memory's hash)
    #: objects every episode's tools get in ``ToolContext.extras`` (e.g. a frozen memory store)
    context: dict[str, Any] = field(default_factory=dict)
    #: non-empty: the configuration cannot run as registered and this says what it needs (e.g. the
    #: memory configurations before ``--memory DIR`` binds a store to them)
    requires: str = ""


_CONFIGS: dict[str, Config] = {}
_ENTRY_POINTS_LOADED = False


def register_config(config: Config, *, replace: bool = False) -> Config:
    """Make ``config`` available by its name (``--config NAME``)."""
    if config.name in _CONFIGS and not replace and _CONFIGS[config.name] is not config:
        raise ValueError(f"configuration {config.name!r} is already registered (pass replace=True)")
    names = [t.name for t in config.tools]
    if len(set(names)) != len(names):
        raise ValueError(f"configuration {config.name!r} lists a tool twice: {names}")
    _CONFIGS[config.name] = config
    return config


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in entry_points(group="fhirgym.configs"):
        ep.load()  # the module registers its configurations on import


def get_config(name: str | Config) -> Config:
    if isinstance(name, Config):
        return name
    if name not in _CONFIGS:
        _load_entry_points()
    if name not in _CONFIGS:
        raise UnknownConfig(f"unknown configuration {name!r}; known: {', '.join(configs())}")
    return _CONFIGS[name]


def configs() -> list[str]:
    _load_entry_points()
    return sorted(_CONFIGS)


BASELINE = register_config(Config("baseline", FHIR_TOOLS, "the six FHIR CRUD tools"))
#: Questions need no writes; three tool schemas instead of six halve the tool block of every prompt
#: (what a CPU model prefills each turn, and what an RL rollout carries).
READ = register_config(Config("read", tuple(t for t in FHIR_TOOLS if not t.writes),
                              "the three FHIR read tools (types, read by id, search): for questions"))
SPECS = register_config(Config("specs", FHIR_TOOLS + tuple(SPEC_TOOLS),
                               "the FHIR tools plus the four FHIR-spec tools"))
CODEACT = register_config(Config(
    "codeact", CODEACT_TOOLS + FHIR_TOOLS,
    "CodeAct: fhir_query/fhir_get into a per-episode workspace, python in the sandbox (with the FHIR CRUD "
    "operations as functions), finish; plus the six FHIR tools (docs/CODEACT.md)"))
