"""Paraphrased prompts: the same instance asked in other words, generated once per (task, seed, model).

The body of the prompt (not the answer-format sentence, which is re-appended verbatim) is rewritten by any chat model. A
paraphrase is accepted only if every entity of the original survives: each parameter value quoted in the prompt (names,
codes, ids), every number (dates, times, doses) and month name; otherwise it is rejected and retried. Accepted
paraphrases are cached on disk, so settings that test robustness to wording (the FHIR-AgentEval paper's settings 3 and 4) are
reproducible without the model. Offline, every family also has phrasings written by us (``data/phrasings.json``:
per-family templates, and generic rewrites and framings as the fallback for families of other packages), checked the
same way: :func:`written_paraphrase`; :func:`offline_paraphrase` takes a cached LLM paraphrase when there is one, else
the written one, and the instance records which (``paraphrase_source``: ``llm-cache`` or ``written``; docs/MEMORY.md).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from pathlib import Path

import orjson

from ..spec import cache_dir
from ._family import Instance

Complete = Callable[[list[dict]], str]

INSTRUCTION = ("Rewrite the following request to a clinical information system in different words, as another "
               "clinician or clerk might phrase it. Keep every name, date, time, number, code and identifier "
               "exactly as written. Do not add or drop any requirement. Reply with the rewritten request only.")
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december")


class ParaphraseUnavailable(RuntimeError):
    pass


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "model"


def cache_path(task_id: str, seed: int, model: str, k: int) -> Path:
    return cache_dir() / "paraphrases" / task_id / f"s{seed}" / _slug(model) / f"{k}.json"


def _flat(value) -> list[str]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _flat(v)]
    if isinstance(value, list | tuple):
        return [x for v in value for x in _flat(v)]
    return [str(value)] if value is not None and not isinstance(value, bool) else []


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).casefold()


def entities(body: str, params: dict) -> list[str]:
    """What a paraphrase of ``body`` must keep."""
    low = _norm(body)
    found = {v for v in _flat(params) if len(v) > 1 and _norm(v) in low}
    found |= set(re.findall(r"\d+(?:[.:/-]\d+)*", body))
    found |= {m for m in MONTHS if re.search(rf"\b{m}\b", low)}
    return sorted(found, key=lambda e: (-len(e), e))


def missing_entities(original: str, candidate: str, params: dict) -> list[str]:
    cand = _norm(candidate)
    return [e for e in entities(original, params) if _norm(e) not in cand]


def _split(prompt: str, inst: Instance) -> tuple[str, str]:
    """(body, format sentence) of a full prompt."""
    body = inst.family.prompt(inst.params).strip()
    tail = prompt[len(body):] if prompt.startswith(body) else ""
    return body, tail


def paraphrase(inst: Instance, complete: Complete, model: str, k: int = 1, attempts: int = 4,
               use_cache: bool = True) -> Instance:
    """The ``k``-th paraphrase of ``inst`` (generated with ``complete`` if not cached)."""
    path = cache_path(inst.task_id, inst.seed, model, k)
    if use_cache and path.exists():
        return _with_prompt(inst, orjson.loads(path.read_bytes())["prompt"], k)
    body, tail = _split(inst.prompt, inst)
    problems: list[str] = []
    for attempt in range(attempts):
        messages = [{"role": "system", "content": INSTRUCTION},
                    {"role": "user", "content": f"(variant {k}, attempt {attempt + 1})\n\n{body}"}]
        text = (complete(messages) or "").strip().strip('"').strip()
        missing = missing_entities(body, text, inst.params)
        if text and not missing and _norm(text) != _norm(body):
            prompt = text + tail
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(orjson.dumps({"task_id": inst.task_id, "seed": inst.seed, "model": model, "k": k,
                                           "original": inst.prompt, "prompt": prompt, "attempts": attempt + 1}))
            return _with_prompt(inst, prompt, k)
        problems.append(f"attempt {attempt + 1}: " + (f"lost {missing}" if missing else "empty or unchanged"))
    raise ParaphraseUnavailable(f"{inst.task_id} seed {inst.seed}: no faithful paraphrase ({'; '.join(problems)})")


def cached_paraphrase(inst: Instance, k: int, model: str | None = None) -> Instance:
    """A paraphrase from the cache only (evaluation runs never call a model for it)."""
    root = cache_dir() / "paraphrases" / inst.task_id / f"s{inst.seed}"
    models = [_slug(model)] if model else sorted(p.name for p in root.glob("*") if (p / f"{k}.json").exists())
    for m in models:
        path = root / m / f"{k}.json"
        if path.exists():
            return _with_prompt(inst, orjson.loads(path.read_bytes())["prompt"], k)
    raise ParaphraseUnavailable(f"no cached paraphrase {k} of {inst.task_id} seed {inst.seed}: run "
                                f"`fhirgym tasks paraphrase --tasks {inst.task_id} --seeds {inst.seed + 1} --count {k}`")


def _with_prompt(inst: Instance, prompt: str, k: int, source: str = "llm-cache") -> Instance:
    new = dataclasses.replace(inst, prompt=prompt, paraphrase=k)
    new.__dict__.pop("reference", None)
    new.__dict__["paraphrase_source"] = source
    return new


def paraphrase_source(inst: Instance) -> str:
    """``template`` (no paraphrase), ``llm-cache`` or ``written``."""
    return inst.__dict__.get("paraphrase_source", "llm-cache") if inst.paraphrase else "template"


_PHRASINGS: dict | None = None


def phrasings() -> dict:
    global _PHRASINGS
    if _PHRASINGS is None:
        from importlib.resources import files

        _PHRASINGS = orjson.loads(files("fhirgym.tasks").joinpath("data", "phrasings.json").read_bytes())
    return _PHRASINGS


def _rewrite(body: str, rule: dict) -> str:
    text = body
    for pattern, repl in rule["rewrites"]:
        if repl == "\\u1":  # capitalise the first letter
            text = re.sub(pattern, lambda m: m.group(1).upper(), text, count=1)
        else:
            text = re.sub(pattern, repl, text)
    return rule["framing"].format(body=text)


@functools.cache
def slot_pattern(template: str) -> re.Pattern:
    """The regex that reads an instance's prompt body back into the slots of ``template`` (the family's
    wording with ``{slot}`` where an instance's text goes; a slot named twice holds the same text)."""
    parts, seen = re.split(r"\{(\w+)\}", template), set()
    for i in range(1, len(parts), 2):
        name = parts[i]
        parts[i] = f"(?P={name})" if name in seen else f"(?P<{name}>.+?)"
        seen.add(name)
    parts[::2] = [re.escape(p) for p in parts[::2]]
    return re.compile("".join(parts), re.DOTALL)


def family_variants(task_id: str) -> list[dict]:
    """The written variants of a family: ``{"prompt": pattern (optional), "phrasings": [...]}`` each.

    An entry of ``families`` is a list of format strings over the params (one variant, no pattern), a list
    of variants (the first whose pattern matches the whole prompt body is used: how a family whose wording
    branches on its params gets phrasings for every branch), or the id of a family with the same prompt.
    """
    entry = phrasings()["families"].get(task_id, [])
    if isinstance(entry, str):
        entry = phrasings()["families"][entry]
    return [{"phrasings": entry}] if entry and all(isinstance(e, str) for e in entry) else list(entry)


def family_phrasings(inst: Instance) -> list[str]:
    """The bodies of the phrasings written for ``inst``'s own family ([] if it has none), filled in from
    its params and from the slots its variant's pattern reads out of the prompt."""
    variants = family_variants(inst.task_id)
    if not variants:
        return []
    body = inst.family.prompt(inst.params).strip()
    for variant in variants:
        found = slot_pattern(variant["prompt"]).fullmatch(body) if "prompt" in variant else None
        if "prompt" not in variant or found:
            fields = {**inst.params, **(found.groupdict() if found else {})}
            return [t.format(**fields) for t in variant["phrasings"]]
    raise ParaphraseUnavailable(f"no written variant of {inst.task_id} matches its prompt (seed {inst.seed}): "
                                f"update data/phrasings.json for {body!r}")


def written_phrasings(inst: Instance) -> list[str]:
    """The bodies of every written phrasing of ``inst`` (family templates first, then the generic ones)."""
    body = inst.family.prompt(inst.params).strip()
    return family_phrasings(inst) + [_rewrite(body, rule) for rule in phrasings()["generic"]]


def written_paraphrase(inst: Instance, k: int) -> Instance:
    """The k-th (1-based) phrasing written by us; refused if it loses an entity or equals the original."""
    body, tail = _split(inst.prompt, inst)
    options = written_phrasings(inst)
    if not 1 <= k <= len(options):
        raise ParaphraseUnavailable(f"{inst.task_id} has {len(options)} written phrasings, not {k}")
    text = options[k - 1]
    missing = missing_entities(body, text, inst.params)
    if missing or _norm(text) == _norm(body):
        raise ParaphraseUnavailable(f"written phrasing {k} of {inst.task_id} seed {inst.seed} "
                                    + (f"loses {missing}" if missing else "is unchanged"))
    return _with_prompt(inst, text + tail, k, "written")


def offline_paraphrase(inst: Instance, k: int, model: str | None = None) -> Instance:
    """A cached LLM paraphrase if there is one, else the written phrasing k (no model is ever called)."""
    try:
        return cached_paraphrase(inst, k, model)
    except ParaphraseUnavailable:
        return written_paraphrase(inst, k)
