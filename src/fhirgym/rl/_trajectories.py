"""Expert trajectories: each instance's reference solution, replayed as a local model's turns.

fhirgym has a verified expert for every instance (the family's reference solution; a QA question's reference program),
so behaviour cloning needs no human data. A trajectory is that solution replayed **as model turns through the evaluation
path itself**: :func:`~fhirgym.runner.run_episode` drives the evaluated agent (ReAct, or CodeAct for QA) on a real
:class:`~fhirgym.env.Episode` with the local model's backend, but the model's replies come from the reference. Every
prompt is rendered by :meth:`LocalBackend.render <fhirgym.agents.LocalBackend.render>`, the very text and tokens
llama.cpp is given at evaluation time; every reply must be one the turn's grammar lets llama.cpp sample
(:meth:`ChatTemplate.accepts <fhirgym.agents.ChatTemplate.accepts>`) and fit the reply limit. A trajectory is kept only
if the replayed episode passes strict validation; the others are listed with the reason (docs/TRAINING.md).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from .._defaults import POLICY
from ..agents import (
    OBSERVATION,
    BackendError,
    ChatResult,
    CodeActAgent,
    LocalBackend,
    ReactAgent,
    parse_tool_calls,
)
from ..env import get_config
from ..runner import EpisodeKey, run_episode
from ..tasks import Instance, TaskInfeasible, get_track, heldout_split, make_instance, select
from ..tasks.qa import QaFamily
from ..world import world_sha256
from ._data import DEFAULT_QA, DEFAULT_WORLD, SPLITS, split_questions, world_of

#: Seeds evaluation keeps for itself: training takes seeds from TRAIN_SEEDS_FROM up, never these.
EVAL_SEEDS = range(0, 100)
TRAIN_SEEDS_FROM = 100
#: Turns an evaluated agent gets (``fhirgym eval``'s default for ReAct; CodeAct's is its own).
MAX_TURNS = 15


class NotExpressible(Exception):
    """The reference solution of an instance cannot be written as turns of the local model."""


#: One expert reply, or a function writing it from the conversation so far (an answer from a result).
Turn = str | Callable[[list[dict]], str]


@dataclass
class Trajectory:
    """One instance's expert episode as token segments: ``segments[i] = (token ids, trained)``."""

    id: str
    track: str
    task_id: str
    seed: int
    agent: str
    turns: int
    calls: int
    segments: list[tuple[list[int], bool]]
    question_id: str | None = None

    @property
    def input_ids(self) -> list[int]:
        return [t for ids, _ in self.segments for t in ids]

    @property
    def labels(self) -> list[int]:
        """Targets for causal-LM training: the token where trained, -100 (ignored) elsewhere."""
        return [t if trained else -100 for ids, trained in self.segments for t in ids]

    def to_json(self) -> dict:
        return {**asdict(self), "segments": [[ids, trained] for ids, trained in self.segments]}

    @classmethod
    def from_json(cls, row: dict) -> Trajectory:
        return cls(**{**row, "segments": [(list(ids), bool(trained)) for ids, trained in row["segments"]]})


@dataclass
class Skipped:
    task_id: str
    seed: int
    reason: str
    question_id: str | None = None


def _call_text(name: str, arguments: dict, schema: dict) -> str:
    """One call as the grammar writes it: Qwen's tags, arguments in the schema's key order (required
    first), single spaces."""
    props = list(schema.get("properties") or {})
    required = [k for k in props if k in (schema.get("required") or ())]
    order = required + [k for k in props if k not in required]
    ordered = {k: arguments[k] for k in order if k in arguments} | {k: v for k, v in arguments.items() if k not in order}
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": ordered}, ensure_ascii=False) + "\n</tool_call>"


#: Calls a local model's turn may hold (``LocalBackend.calls_per_turn``).
CALLS_PER_TURN = 3
_IDS = re.compile(r'"id"\s*:\s*"([A-Za-z0-9\-.]{1,64})"')


def action_turns(inst: Instance, schemas: list[dict], max_turns: int = MAX_TURNS) -> list[Turn]:
    """The reference solution as ReAct replies, then its final text: one call a turn (each may use what
    the last one returned); where that needs more turns than the agent gets, up to CALLS_PER_TURN calls
    share a turn, a call joining only if it uses no id that a call of the same turn returned."""
    by_name = {s["function"]["name"]: s["function"].get("parameters") or {} for s in schemas}
    ref = inst.reference
    for call in ref.calls:
        if call.name not in by_name:
            raise NotExpressible(f"the reference calls {call.name}, which the configuration does not grant")
    groups: list[list] = [[c] for c in ref.calls]
    if len(groups) + 1 > max_turns:
        groups, fresh = [], set()
        for call in ref.calls:
            args = json.dumps(call.arguments)
            if groups and len(groups[-1]) < CALLS_PER_TURN and not any(i in args for i in fresh):
                groups[-1].append(call)
            else:
                groups.append([call])
                fresh = set()
            fresh |= set(_IDS.findall(orjson.dumps(call.output, default=str).decode()))
    turns = ["\n".join(_call_text(c.name, c.arguments, by_name[c.name]) for c in group) for group in groups]
    return [*turns, ref.text]


def qa_turns(inst: Instance, schemas: list[dict]) -> list[Turn]:
    """A QA question's reference program as CodeAct replies: its fetches (a call a turn), its code block,
    then the final answer rendered from what the code returned."""
    from ..tasks.qa import program_reply, reference_program

    fam = inst.family
    assert isinstance(fam, QaFamily)
    program = reference_program(fam.question)
    by_name = {s["function"]["name"]: s["function"].get("parameters") or {} for s in schemas}
    fetches = [_call_text(f["name"], f["arguments"], by_name[f["name"]]) for f in program.fetches]

    def answer(messages: list[dict]) -> str:
        last = str(messages[-1].get("content") or "")
        result = orjson.loads(last.removeprefix(OBSERVATION)) if last.startswith(OBSERVATION) else {}
        if "error" in result:
            raise NotExpressible(f"the reference program failed in the sandbox: {str(result['error'])[-200:]}")
        if "answer_truncated" in result:
            raise NotExpressible("the program's answer was cut to fit the tool budget")
        return program_reply(result.get("answer"))

    return [*fetches, f"```python\n{program.code.strip()}\n```", answer]


class _Replay:
    """A chat backend that answers with the expert's replies and records what the model would be shown:
    each turn's prompt exactly as ``backend`` renders it, and the reply, checked against the turn's
    grammar and reply limit."""

    def __init__(self, backend: LocalBackend, turns: list[Turn]) -> None:
        self.backend, self.turns = backend, list(turns)
        self.name = backend.name
        self.tool_budget, self.max_reply_tokens = backend.tool_budget, backend.max_reply_tokens
        self.record: list[tuple[str, str]] = []  # (prompt, reply) per turn
        self.failure: str | None = None

    def chat(self, messages: list[dict], tools: list[dict] | None = None, *, temperature: float = 0.0,
             max_tokens: int = 1024, seed: int | None = None, answer_schema: dict | None = None) -> ChatResult:
        try:
            return self._turn(messages, tools, max_tokens, answer_schema)
        except NotExpressible as exc:
            self.failure = str(exc)
            raise BackendError(f"not expressible: {exc}") from exc

    def _turn(self, messages: list[dict], tools: list[dict] | None, max_tokens: int,
              answer_schema: dict | None) -> ChatResult:
        if len(self.record) >= len(self.turns):
            raise NotExpressible("the episode asked for more turns than the reference has")
        turn = self.turns[len(self.record)]
        reply = turn if isinstance(turn, str) else turn(messages)
        prompt = self.backend.render(messages, tools, answer_schema)
        template = self.backend.template()
        gbnf = self.backend.turn_gbnf(messages, tools, answer_schema)
        if gbnf is not None and (why := template.accepts(gbnf, reply)):
            raise NotExpressible(f"turn {len(self.record) + 1}: {why}")
        n = len(template.tokenize(reply)) + 1
        if n > max_tokens:
            raise NotExpressible(f"turn {len(self.record) + 1} is {n} tokens, over the {max_tokens} a reply may have")
        self.record.append((prompt, reply))
        names = {t["function"]["name"] for t in tools or []}
        calls, text = parse_tool_calls(reply, names) if tools else ([], reply)
        if calls:
            self.backend.remember(text, [(c.name, c.arguments) for c in calls], reply)
        return ChatResult(text, calls, len(template.tokenize(prompt)), n, "tool_calls" if calls else "stop")


def _segments(record: list[tuple[str, str]], template) -> list[tuple[list[int], bool]]:
    """Prompt and reply segments whose tokens concatenate to the conversation's: each prompt must extend
    the last prompt, reply and end-of-turn (the history is rendered with the model's own text)."""
    segments: list[tuple[list[int], bool]] = []
    shown = ""
    for prompt, reply in record:
        if not prompt.startswith(shown):
            raise NotExpressible("a later prompt does not extend the conversation so far")
        segments.append((template.tokenize(prompt[len(shown):]), False))
        segments.append(([*template.tokenize(reply), template.eos_id], True))
        shown = prompt + reply + template.eos
    whole = template.tokenize(shown)
    if [t for ids, _ in segments for t in ids] != whole:
        raise NotExpressible("the segments' tokens differ from the whole conversation's")
    return segments


_LOOPS = {"react": ReactAgent, "codeact": CodeActAgent}


def expert_trajectory(inst: Instance, backend: LocalBackend, *, track: str = "action",
                      max_turns: int = MAX_TURNS) -> Trajectory:
    """The kept trajectory of ``inst`` (raises :class:`NotExpressible` with the reason otherwise)."""
    tr = get_track(track)
    config, codeact = tr.config, tr.loop == "codeact"
    schemas = [t.openai_schema() for t in get_config(config).tools]
    turns = qa_turns(inst, schemas) if codeact else action_turns(inst, schemas, max_turns)
    if len(turns) > max_turns:
        raise NotExpressible(f"{len(turns)} turns, over the {max_turns} the agent gets")
    replay = _Replay(backend, turns)
    agent = _LOOPS[tr.loop](replay, max_iterations=max_turns)
    key = EpisodeKey(config, inst.task_id, inst.seed, 0, 1)
    line, _ = run_episode(key, inst, agent, config, budget=backend.tool_budget, max_iterations=max_turns)
    if replay.failure:
        raise NotExpressible(replay.failure)
    if line["status"] != "pass":
        raise NotExpressible(f"the replayed episode did not pass: {'; '.join(line['reasons'])[:300]}")
    if len(replay.record) != len(turns):
        raise NotExpressible(f"the episode ended after {len(replay.record)} of {len(turns)} turns")
    segments = _segments(replay.record, backend.template())
    question = getattr(inst.family, "question", None)
    return Trajectory(f"{track}/{inst.task_id}/s{inst.seed}" + (f"/{question.id}" if question else ""), track,
                      inst.task_id, inst.seed, tr.loop, len(turns),
                      len(inst.reference.calls) if not codeact else len(turns) - 1, segments,
                      question.id if question else None)


# -- what to train on -------------------------------------------------------------------------------------

class OverlapError(ValueError):
    """Training data that would reach into what evaluation keeps for itself."""


@dataclass
class Selection:
    """What a trajectory set is made of: the track, its families or templates, seeds, world, split."""

    track: str = "action"
    split: str = "train"
    tasks: str = "train"  # action: a selector, or "train"/"eval" (the held-out split's sides)
    per_family: int = 20
    world: dict = field(default_factory=lambda: dict(DEFAULT_WORLD))
    qa: dict = field(default_factory=lambda: dict(DEFAULT_QA))
    allow_overlap: bool = False

    def families(self) -> list[str]:
        split = heldout_split()
        if self.tasks in split:
            return list(split[self.tasks])
        return [f.id for f in select(self.tasks)]

    def seeds(self) -> list[int]:
        """Action seeds: training from TRAIN_SEEDS_FROM on, validation from the RL valid range."""
        start = TRAIN_SEEDS_FROM if self.split == "train" else SPLITS[self.split].start
        return list(range(start, start + self.per_family))

    def check(self) -> None:
        """Refuse evaluation's families, seeds or patients unless ``allow_overlap``."""
        if self.allow_overlap:
            return
        if self.split not in ("train", "valid"):
            raise OverlapError(f"split {self.split!r}: trajectories are for training (train) or its "
                               "validation loss (valid); evaluation's own data stays out")
        if get_track(self.track).seeded:
            held = sorted(set(self.families()) & set(heldout_split()["eval"]))
            if held:
                raise OverlapError(f"{len(held)} of the chosen families are the held-out split's eval families "
                                   f"({', '.join(held[:3])}…): pass --allow-overlap to train on them anyway")


def _instances(sel: Selection) -> Iterator[Instance | Skipped]:
    tw = world_of(sel.world)
    if get_track(sel.track).by_question:
        from ..tasks.qa import qa_instance

        tasks = "all" if sel.tasks == "train" else sel.tasks
        for _, question in split_questions(tw, sel.split, tasks, sel.per_family, sel.qa):
            yield qa_instance(question, tw)
        return
    for task in sel.families():
        for seed in sel.seeds():
            try:
                yield make_instance(task, seed, tw)
            except TaskInfeasible as exc:
                yield Skipped(task, seed, f"infeasible: {exc}")


def build_trajectories(sel: Selection, model: str = POLICY,
                       progress: Callable[[Trajectory | Skipped], None] | None = None
                       ) -> tuple[list[Trajectory], list[Skipped]]:
    """Every instance of the selection replayed (:func:`expert_trajectory`): the kept and the skipped."""
    sel.check()
    backend = LocalBackend(model)
    kept: list[Trajectory] = []
    skipped: list[Skipped] = []
    for inst in _instances(sel):
        item: Trajectory | Skipped = inst if isinstance(inst, Skipped) else _kept_or_skipped(inst, backend, sel.track)
        (kept if isinstance(item, Trajectory) else skipped).append(item)  # type: ignore[arg-type]
        if progress:
            progress(item)
    return kept, skipped


def _kept_or_skipped(inst: Instance, backend: LocalBackend, track: str) -> Trajectory | Skipped:
    question = getattr(inst.family, "question", None)
    try:
        return expert_trajectory(inst, backend, track=track)
    except NotExpressible as exc:
        return Skipped(inst.task_id, inst.seed, str(exc), question.id if question else None)


def commit() -> str | None:
    """The git commit of the working tree fhirgym runs from (None outside a checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent, check=False)
        return out.stdout.strip() or None
    except OSError:
        return None


TRAJECTORIES = "trajectories.jsonl"
SKIPPED = "skipped.jsonl"
MANIFEST = "manifest.json"


def write_trajectories(out: Path, sel: Selection, model: str = POLICY,
                       progress: Callable[[Trajectory | Skipped], None] | None = None) -> dict:
    """Build the selection's trajectories into ``out`` (trajectories.jsonl, skipped.jsonl, manifest.json);
    returns the manifest: what the data is made of and counts per family."""
    t0 = time.perf_counter()
    kept, skipped = build_trajectories(sel, model, progress)
    out.mkdir(parents=True, exist_ok=True)
    body = b"".join(orjson.dumps(t.to_json()) + b"\n" for t in kept)
    (out / TRAJECTORIES).write_bytes(body)
    (out / SKIPPED).write_bytes(b"".join(orjson.dumps(asdict(s)) + b"\n" for s in skipped))
    per: dict[str, dict[str, int]] = {}
    for t in kept:
        per.setdefault(t.task_id, {"kept": 0, "skipped": 0})["kept"] += 1
    for s in skipped:
        per.setdefault(s.task_id, {"kept": 0, "skipped": 0})["skipped"] += 1
    tw = world_of(sel.world)
    seeded = get_track(sel.track).seeded
    manifest = {"selection": asdict(sel), "families": sel.families() if seeded else None,
                "seeds": sel.seeds() if seeded else None, "model": model,
                "world": {**sel.world, "sha256": world_sha256(tw.path)}, "commit": commit(),
                "kept": len(kept), "skipped": len(skipped), "per_family": dict(sorted(per.items())),
                "tokens": sum(len(t.input_ids) for t in kept),
                "trained_tokens": sum(sum(len(ids) for ids, tr in t.segments if tr) for t in kept),
                "sha256": hashlib.sha256(body).hexdigest(), "seconds": round(time.perf_counter() - t0, 1)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def read_trajectories(path: Path) -> list[Trajectory]:
    """The trajectories of a directory written by :func:`write_trajectories` (or of its JSONL file)."""
    file = path / TRAJECTORIES if path.is_dir() else path
    return [Trajectory.from_json(orjson.loads(line)) for line in file.read_bytes().splitlines() if line.strip()]
