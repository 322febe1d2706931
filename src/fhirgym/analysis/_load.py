"""Reading result directories written by ``fhirgym eval`` (contract: docs/RESULTS.md)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Key added to every loaded result: the directory it came from (to find its transcript).
SOURCE_KEY = "_dir"


class ResultsError(ValueError):
    """A result directory cannot be read (no results.jsonl)."""


def load_results(dirs: list[Path] | list[str] | Path | str) -> list[dict[str, Any]]:
    """Every episode of every directory, in file order, each tagged with ``_dir`` (its directory).

    A line that does not parse (a run killed mid-write on a filesystem without atomic appends) is
    skipped with a warning rather than losing the whole directory.
    """
    if isinstance(dirs, str | Path):
        dirs = [dirs]
    out: list[dict[str, Any]] = []
    for d in map(Path, dirs):
        path = d / "results.jsonl" if d.is_dir() else d
        if not path.is_file():
            raise ResultsError(f"no results.jsonl in {d}")
        base = path.parent
        with path.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    log.warning("%s:%d: not JSON, skipped", path, lineno)
                    continue
                if not isinstance(rec, dict) or "episode_id" not in rec:
                    log.warning("%s:%d: not a result record, skipped", path, lineno)
                    continue
                rec[SOURCE_KEY] = str(base)
                out.append(rec)
    _label_configs(out)
    return out


def _label_configs(results: list[dict[str, Any]]) -> None:
    """When the directories hold different agents or models, every comparison in the report is between
    (agent, model, config) combinations: fold agent and model into the config label (the original
    stays in ``_config``), e.g. ``react · qwen2.5-coder-1.5b · baseline`` next to ``reference · baseline``."""
    pairs = {(r.get("agent"), r.get("model")) for r in results}
    if len(pairs) <= 1:
        return
    for r in results:
        model = str(r["model"]).split("/")[-1] if r.get("model") else None
        r["_config"] = r.get("config")
        r["config"] = " · ".join(str(x) for x in (r.get("agent"), model, r.get("config")) if x)


def load_transcript(result: dict[str, Any]) -> dict[str, Any] | None:
    """The episode's transcript, or None when it is missing or unreadable (the report then shows the result line)."""
    rel = result.get("transcript")
    base = result.get(SOURCE_KEY)
    if not rel or base is None:
        return None
    path = Path(base) / rel
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def load_run_info(dirs: list[Path]) -> list[dict[str, Any]]:
    """``run.json`` of each directory (``{}`` when absent), with the directory under ``dir``."""
    infos = []
    for d in map(Path, dirs):
        info: dict[str, Any] = {}
        try:
            loaded = json.loads((d / "run.json").read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                info = loaded
        except (OSError, json.JSONDecodeError):
            pass
        infos.append({"dir": str(d), **info})
    return infos
