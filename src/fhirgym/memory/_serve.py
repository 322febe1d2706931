"""Serving a frozen memory: the configurations of Table 1 and the prompt mode.

``memory``, ``memory-specs`` and ``memory-specs+specs`` are registered here (the layer that owns memory
registers its own configurations) as *unbound*: they say what they need until ``bind(name, MEMDIR)``
re-registers them with a frozen store in every episode's tool context and its hash in their labels.
Two ways to use a memory: ``tools`` (the agent calls searchMemory / getMemoryTips) and ``prompt`` (the
top-k lessons for the task, under a token budget, go into the system prompt before the agent starts).
"""

from __future__ import annotations

from pathlib import Path

from ..env import Config, get_config, register_config
from ..tasks import Instance
from ..tools import FHIR_TOOLS, MEMORY_KEY, MEMORY_TOOLS, SPEC_TOOLS
from ._store import MemoryStore, open_frozen

MODES = ("tools", "prompt")
#: name → (trained with specs?, spec tools at run time?) — Table 1's three memory rows
MEMORY_CONFIGS = {"memory": (False, False), "memory-specs": (True, False), "memory-specs+specs": (True, True)}
PROMPT_K = 4
PROMPT_TOKENS = 600  # budget of the lessons block in prompt mode (≈ 4 characters a token)

_TOOLS_SUFFIX = ("You have a long-term memory of lessons learned on similar FHIR tasks. Before you act, call "
                 "searchMemory with a short description of the task, and getMemoryTips for the resource types "
                 "and operations you will use; follow the lessons where they apply.")


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def prompt_block(store: MemoryStore, inst: Instance, k: int = PROMPT_K, budget: int = PROMPT_TOKENS) -> str:
    """The lessons for ``inst`` as a system-prompt block: top-k macro lessons by similarity to the prompt,
    then micro tips for the resource types the family works on, cut at ``budget`` tokens (whole lessons)."""
    items = [f"- {x['text']}" for x in store.search(inst.prompt, k)]
    for rtype in sorted(set(getattr(inst.family, "resource_types", ()) or ())):
        items += [f"- [{t['resource_type']} {t['operation']}] {t['text']}" for t in store.tips(rtype)]
    return budgeted_block("Lessons from your long-term memory of similar tasks (follow them where they apply):",
                          items, budget)


def budgeted_block(head: str, items: list[str], budget: int) -> str:
    """``head`` and the leading whole ``items`` that fit in ``budget`` tokens; empty when none fits."""
    lines, used = [head], _tokens(head)
    for item in items:
        if used + _tokens(item) > budget:
            break
        lines.append(item)
        used += _tokens(item)
    return "\n".join(lines) if len(lines) > 1 else ""


def _config(name: str, store: MemoryStore | None, mode: str, memory_dir: str = "") -> Config:
    trained_with_specs, specs_at_run = MEMORY_CONFIGS[name]
    base = FHIR_TOOLS + (tuple(SPEC_TOOLS) if specs_at_run else ())
    what = (f"FHIR tools{' + spec tools' if specs_at_run else ''} + a memory trained "
            f"{'with' if trained_with_specs else 'without'} specs ({mode} mode)")
    if store is None:
        return Config(name, base + MEMORY_TOOLS, what,
                      requires="a frozen memory: pass --memory MEMDIR (fhirgym memory train ... --out MEMDIR"
                               f"{' --with-specs' if trained_with_specs else ''})")
    labels = {"memory": store.content_hash or "", "memory_dir": memory_dir, "memory_mode": mode}
    if mode == "tools":
        return Config(name, base + MEMORY_TOOLS, what, system_suffix=_TOOLS_SUFFIX, labels=labels,
                      context={MEMORY_KEY: store})
    return Config(name, base, what, prepare=lambda inst: prompt_block(store, inst), labels=labels)


def bound_config(name: str, memory_dir: str | Path, mode: str = "tools") -> Config:
    """Configuration ``name`` bound to the frozen memory in ``memory_dir`` (not registered)."""
    if name not in MEMORY_CONFIGS:
        raise ValueError(f"--memory goes with a memory configuration ({', '.join(MEMORY_CONFIGS)}), not {name!r}")
    if mode not in MODES:
        raise ValueError(f"memory mode must be one of {', '.join(MODES)}")
    return _config(name, open_frozen(memory_dir), mode, str(memory_dir))


def bind(name: str, memory_dir: str | Path, mode: str = "tools") -> Config:
    """Register configuration ``name`` bound to the frozen memory in ``memory_dir``; returns it."""
    return register_config(bound_config(name, memory_dir, mode), replace=True)


for _name in MEMORY_CONFIGS:
    try:
        get_config(_name)
    except KeyError:
        register_config(_config(_name, None, "tools"))
