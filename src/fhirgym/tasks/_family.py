"""Task families and their instances: the few nouns every other part of fhirgym speaks.

A :class:`Family` is a kind of request ("book the first free slot with Dr X"): it samples its parameters
from the world by seed, writes its prompt (ending with the required answer format), adds setup
resources on top of the world, states the gold — expected answer and expected state change — and has a
reference solution written with the same tools agents get. An :class:`Instance` is a family plus a seed:
params, prompt, setup, a frozen ``now`` and the gold, all fixed **before any agent acts** (the published
sandbox recomputed gold answers after the agent had changed the server).
"""

from __future__ import annotations

import hashlib
import random
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

import orjson

from ..fhir import FhirError, FhirServer, InProcessClient, ServerConfig, Snapshot, Store
from ..tools import FHIR_TOOLS, Toolbox, ToolCall, ToolContext
from ..world import DEFAULT_ANCHOR, META_KEY
from ._answer import NOT_FOUND, AnswerSpec, render
from ._diff import Change, Mark, diff, mark
from ._evidence import looked_at
from ._expect import Expect, match
from ._split import heldout_split

CATEGORIES = ("records", "billing", "scheduling", "orders", "clinical")
CATEGORY_TITLES = {"records": "Patient records", "billing": "Insurance & billing",
                   "scheduling": "Scheduling & appointments", "orders": "Surgery & genetic test orders",
                   "clinical": "Clinical orders"}


#: the tools that change the store: prohibited to an instance that writes nothing
WRITE_TOOLS = ("createResource", "updateResource", "deleteResource")


class TaskInfeasible(RuntimeError):
    """No entity of the world fits this family for this seed (after many draws)."""


@dataclass
class Gold:
    """What a correct agent achieves: the answer (None: not checked) and the required state change."""

    answer: Any = None
    expects: list[Expect] = field(default_factory=list)


class View:
    """Read access to a world state for sampling and gold computation (never used by agents).

    ``family`` and ``seed`` label this instance's random streams (:meth:`Family.stream`: the family's id
    and the instance's seed unless the family maps them). ``cache`` is shared by every view of the same world file: families keep derived, base-only facts
    there (e.g. the list of practitioners) so that creating an instance stays in milliseconds.
    """

    def __init__(self, world: TaskWorld, client: InProcessClient, now: datetime, seed: int = 0,
                 family: str = "") -> None:
        self.world = world
        self.client = client
        self.now = now
        self.seed = seed
        self.family = family
        self.attempt = 0  # the framework's redraw of this seed (sample returned None before)

    def new_id(self, label: str) -> str:
        """An id for a setup resource in the world's own form (a UUID v4), fixed by family, seed and
        ``label``: nothing in it tells a planted target or distractor from the world's resources."""
        bits = random.Random(f"setup-id|{self.family}|{self.seed}|{label}").getrandbits(128)
        return str(uuid.UUID(int=bits, version=4))

    @property
    def anchor(self) -> date:
        return self.world.anchor

    def cached(self, key: str, compute) -> Any:
        """``compute()`` once per world; it runs against the bare world (never an instance's setup)."""
        if key not in self.world.cache:
            current = self.client
            self.client = self.world.base_client()
            try:
                self.world.cache[key] = compute()
            finally:
                self.client = current
        return self.world.cache[key]

    def search(self, rtype: str, params: dict | list | None = None) -> list[dict]:
        """Every match, all pages; a rejected search is a bug in the family, so it raises."""
        return self.client.search_all(rtype, params, max_pages=10_000, strict=True)

    def read(self, rtype: str, rid: str) -> dict | None:
        resp = self.client.read(rtype, rid)
        return resp.body if resp.status == 200 else None


class TaskWorld:
    """A world file opened for tasks: its snapshot, anchor date, the spec and a per-world cache."""

    _open: ClassVar[dict[Path, TaskWorld]] = {}

    def __init__(self, path: str | Path) -> None:
        from ..spec import load_spec

        self.path = Path(path).resolve()
        self.snapshot = Snapshot(self.path)
        self.spec = load_spec()
        self.cache: dict[str, Any] = {}
        store = self.snapshot.open()
        try:
            manifest = orjson.loads(store.get_meta(META_KEY) or "{}")
        finally:
            store.close()
        self.manifest = manifest
        self.anchor = date.fromisoformat(manifest["anchor"]) if manifest.get("anchor") else DEFAULT_ANCHOR
        self.lock = threading.Lock()
        self._updated: datetime | None = None
        self._scratch: InProcessClient | None = None
        self._base: InProcessClient | None = None
        self.clock = datetime.now(UTC)  # the scratch server's clock

    def base_client(self) -> InProcessClient:
        """A client on the bare world, never written: what per-world caches are computed from."""
        if self._base is None:
            self._base = InProcessClient(FhirServer(self.snapshot.open(), self.spec, ServerConfig()), self.snapshot)
        return self._base

    @property
    def last_updated(self) -> datetime:
        """The world's ``meta.lastUpdated`` (its latest): setup resources are written at this moment, so
        neither their timestamps nor the (lastUpdated, id) search order set them apart."""
        if self._updated is None:
            newest = self.base_client().search("Patient", {"_sort": "-_lastUpdated", "_count": "1"}).body
            stamp = newest["entry"][0]["resource"]["meta"]["lastUpdated"]
            self._updated = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        return self._updated

    def scratch(self, now: datetime) -> InProcessClient:
        """The world's one scratch store (reset, clock set to ``now``) where instances are prepared.

        Reusing the store saves opening and closing a connection per instance; the server (microseconds) is
        new, so its timestamps start from the clock and never from an earlier instance's writes. Callers
        hold ``self.lock``.
        """
        store = self._scratch.server.store if self._scratch is not None else self.snapshot.open()
        self._scratch = InProcessClient(FhirServer(store, self.spec, ServerConfig(clock=lambda: self.clock)),
                                        self.snapshot)
        self.clock = now
        self._scratch.reset()
        return self._scratch

    @classmethod
    def open(cls, path: str | Path) -> TaskWorld:
        """One TaskWorld per file and process (its cache is worth keeping)."""
        key = Path(path).resolve()
        if key not in cls._open:
            cls._open[key] = cls(key)
        return cls._open[key]


class Family:
    """Base class of task families; subclasses set the class attributes and implement the hooks.

    Hooks: :meth:`sample` (params from the world, None if this draw does not fit), :meth:`prompt`,
    :meth:`setup` (resources to add, ids from ``view.new_id``), :meth:`gold` (answer + expected changes, from the
    pre-run state), :meth:`solve` (the reference solution, through the tools; returns the final text).
    """

    id: ClassVar[str]
    category: ClassVar[str]
    difficulty: ClassVar[int]  # 1 = one lookup, 2 = several steps or a filter, 3 = reasoning over many
    writes: ClassVar[bool]  # some instance may write; each instance decides (Instance.writes: its gold)
    resource_types: ClassVar[tuple[str, ...]]  # the agent must touch each of these
    sequences: ClassVar[tuple[tuple[str, ...], ...]]  # alternative required tool-call sequences
    #: a family whose instances may or may not write (a conditional order): the resource types and
    #: sequences of an instance that writes nothing (None: the same as the family's)
    read_resource_types: ClassVar[tuple[str, ...] | None] = None
    read_sequences: ClassVar[tuple[tuple[str, ...], ...] | None] = None
    #: None: by instance, the write tools for an instance that writes nothing and none otherwise
    prohibited_tools: ClassVar[tuple[str, ...] | None] = None
    answer: ClassVar[AnswerSpec | None] = None
    title: ClassVar[str] = ""
    #: bumped whenever a change makes its results incomparable with earlier ones (prompt, params, setup,
    #: gold or validator); result lines and run.json carry it, a digest test holds it to that
    version: ClassVar[int] = 1
    #: the resource types a "nothing found" answer is a claim about: it passes only after a successful
    #: search or read of one of them (None: the instance's resource types but Patient, else Patient)
    negative_evidence: ClassVar[tuple[str, ...] | None] = None

    @classmethod
    def access(cls) -> str:
        """``R``, ``W``, or ``R/W`` for a family whose instances decide whether they write (a conditional
        order): what ``tasks list`` and docs/FAMILIES.md show."""
        if cls.read_resource_types is not None or cls.read_sequences is not None:
            return "R/W"
        return "W" if cls.writes else "R"

    def negative(self, gold: Gold) -> bool:
        """Whether ``gold``'s answer is "nothing found" (what a reply may claim only after a look)."""
        return gold.answer is NOT_FOUND

    def stream(self, seed: int) -> tuple[str, int]:
        """The label and seed of the random streams that draw instance ``seed`` (clock, params, setup ids):
        by default the family's own id and the seed. A family merged from older ones maps its seeds onto
        theirs, so that it reproduces their instances at documented seeds."""
        return self.id, seed

    def sample(self, view: View, rng: random.Random) -> dict | None:
        raise NotImplementedError

    def prompt(self, params: dict) -> str:
        raise NotImplementedError

    def setup(self, view: View, params: dict) -> list[dict]:
        return []

    def gold(self, view: View, params: dict) -> Gold:
        raise NotImplementedError

    def solve(self, tools: Toolbox, params: dict, now: datetime) -> str:
        raise NotImplementedError

    def distractor_probe(self, view: View, params: dict) -> bool | None:
        """Families that plant distractors say, on the pre-run state, whether the first hit of the plain
        search an agent starts with is one (None: this instance has no distractor). ``tasks check`` wants it
        so in at least half of the instances that have one: a first-hit agent must not pass by luck."""
        return None

    # -- helpers ---------------------------------------------------------------------------------
    def full_prompt(self, params: dict) -> str:
        text = self.prompt(params).strip()
        if self.answer is not None:
            return text + "\n\n" + self.answer.instructions()
        return text + "\n\nWhen you have finished, reply with a one-sentence summary of what you did."


_REGISTRY: dict[str, Family] = {}


def register(cls: type[Family] | str | None = None, /, *, difficulty: int | None = None, version: int | None = None,
             touches: tuple[str, ...] | None = None, sequences: tuple[tuple[str, ...], ...] | None = None,
             writes: bool | None = None, category: str | None = None, title: str | None = None):
    """Make a family available by its id. Two forms:

    ``@register("records.find_patient", difficulty=1, touches=("Patient",), sequences=(("searchResources",),))``
    declares the header: ``writes`` defaults to False, the category to the family's package (or module)
    that is a category, the title to the docstring's first line, ``version`` to 1. Bare ``@register`` on a
    class that sets the attributes itself is the older form, still accepted."""
    if isinstance(cls, type):
        return _register(cls)
    declared = {"id": cls, "difficulty": difficulty, "version": version, "resource_types": touches,
                "sequences": sequences, "writes": writes, "category": category, "title": title}

    def apply(family: type[Family]) -> type[Family]:
        for attr, value in declared.items():
            if value is not None:
                setattr(family, attr, _frozen(value) if attr in ("sequences", "resource_types") else value)
        if not hasattr(family, "writes"):
            family.writes = False
        if not hasattr(family, "category"):
            parts = [p for p in family.__module__.split(".") if p in CATEGORIES]
            if not parts:
                raise TypeError(f"{family.__name__}: no category given and none in its module {family.__module__}")
            family.category = parts[-1]
        if not family.title:
            family.title = next(iter((family.__doc__ or "").strip().splitlines()), "").strip()
        return _register(family)

    return apply


def _frozen(value):
    return tuple(_frozen(v) for v in value) if isinstance(value, list | tuple) else value


def _register(cls: type[Family]) -> type[Family]:
    for attr in ("id", "category", "difficulty", "writes", "resource_types", "sequences"):
        if not hasattr(cls, attr):
            raise TypeError(f"{cls.__name__} lacks {attr}")
    if cls.category not in CATEGORIES:
        raise TypeError(f"{cls.id}: unknown category {cls.category}")
    if cls.difficulty not in (1, 2, 3):
        raise TypeError(f"{cls.id}: difficulty must be 1, 2 or 3")
    if not isinstance(cls.version, int) or isinstance(cls.version, bool) or cls.version < 1:
        raise TypeError(f"{cls.id}: version must be a whole number from 1")
    if cls.id in _REGISTRY and type(_REGISTRY[cls.id]) is not cls:
        raise TypeError(f"duplicate task id {cls.id}")
    if not cls.writes and cls.answer is None:
        raise TypeError(f"{cls.id}: a read-only family needs an answer spec")
    _REGISTRY[cls.id] = cls()
    return cls


#: The entry-point group through which installed packages add task families; fhirgym's own library is
#: listed there too (pyproject.toml), so the registry knows no family module by name.
ENTRY_POINT_GROUP = "fhirgym.tasks"
_entry_points_loaded = False


class FamiliesUnavailable(RuntimeError):
    """A module of task families could not be loaded, or added no family."""


def load_families(*modules: str) -> list[Family]:
    """Import each module (``pkg.module``); its ``@register`` classes join the registry. Returns the
    families they hold, in the registry's order. A module that cannot be imported or holds no family is
    an error, never skipped."""
    import importlib

    families()  # the installed ones first: an outside id that repeats one of them is then refused
    found: list[Family] = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise FamiliesUnavailable(f"cannot import task families from {name!r}: {exc}") from exc
        mine = [f for f in _REGISTRY.values()  # a package's families live in its modules
                if type(f).__module__ == module.__name__ or type(f).__module__.startswith(module.__name__ + ".")]
        if not mine:
            raise FamiliesUnavailable(f"module {name!r} registers no task family (decorate them with @register)")
        found += [f for f in mine if f not in found]
    return sorted(found, key=_order)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    from importlib.metadata import entry_points

    eps = list(entry_points(group=ENTRY_POINT_GROUP))
    if not any(ep.value.startswith("fhirgym.tasks.") for ep in eps):
        raise FamiliesUnavailable(f"no {ENTRY_POINT_GROUP!r} entry points of fhirgym's own library: its "
                                  "installed metadata is stale (reinstall it: pip install -e .)")
    for ep in sorted(eps, key=lambda e: e.value):
        try:
            ep.load()  # the module's @register fills the registry
        except Exception as exc:
            raise FamiliesUnavailable(f"entry point {ep.name} = {ep.value} failed to load: {exc}") from exc
    _entry_points_loaded = True


def _order(f: Family) -> tuple:
    return (CATEGORIES.index(f.category), f.id)


def families() -> list[Family]:
    """Every registered family: fhirgym's library and every installed package's (entry points), plus any
    loaded with :func:`load_families`."""
    _load_entry_points()
    return sorted(_REGISTRY.values(), key=_order)


def get_family(task_id: str) -> Family:
    fams = {f.id: f for f in families()}
    if task_id not in fams:
        raise KeyError(f"unknown task {task_id!r}; see `fhirgym tasks list`")
    return fams[task_id]


def frozen_now(anchor: date, rng: random.Random) -> datetime:
    """A clock for an instance: a day of the anchor's week (Monday to Sunday), any minute of the day.

    Never before the anchor: the world was last updated at its midnight, and no resource an agent sees
    may have been updated after "now".
    """
    day = anchor + timedelta(days=rng.randint(0, 6))
    minute = rng.randrange(24 * 60)
    return datetime(day.year, day.month, day.day, minute // 60, minute % 60, tzinfo=UTC)


# -- instances -----------------------------------------------------------------------------------------

@dataclass
class Verdict:
    success: bool
    light_success: bool | None
    answer_ok: bool | None
    reasons: list[str]
    collateral: list[str]
    changes: list[Change]
    #: the answer was the right "nothing found", but the run never looked at what it is about
    unsupported_negative: bool = False

    def to_json(self) -> dict:
        out = {"success": self.success, "light_success": self.light_success, "answer_ok": self.answer_ok,
               "reasons": self.reasons, "collateral": self.collateral}
        if self.unsupported_negative:
            out["unsupported_negative"] = True
        return out


@dataclass
class ReferenceRun:
    text: str
    calls: list[ToolCall]
    verdict: Verdict


@dataclass
class Instance:
    family: Family
    seed: int
    params: dict
    now: datetime
    prompt: str
    setup: list[dict]
    snapshot: Snapshot  # world base + setup layer: the pre-run state
    gold: Gold
    world: TaskWorld
    paraphrase: int = 0

    @property
    def task_id(self) -> str:
        return self.family.id

    @property
    def writes(self) -> bool:
        """Whether this instance expects a change (decided per instance: a conditional order's seeds draw
        both branches); what the light validator, the results' read/write split and the report follow."""
        return bool(self.gold.expects)

    @property
    def resource_types(self) -> tuple[str, ...]:
        fam = self.family
        return fam.resource_types if self.writes or fam.read_resource_types is None else fam.read_resource_types

    @property
    def sequences(self) -> tuple[tuple[str, ...], ...]:
        fam = self.family
        return fam.sequences if self.writes or fam.read_sequences is None else fam.read_sequences

    @property
    def evidence_types(self) -> tuple[str, ...]:
        """The types a "nothing found" answer of this instance must have looked at (one of them)."""
        if self.family.negative_evidence is not None:
            return self.family.negative_evidence
        return tuple(t for t in self.resource_types if t != "Patient") or ("Patient",)

    @property
    def prohibited_tools(self) -> tuple[str, ...]:
        if self.family.prohibited_tools is not None:
            return self.family.prohibited_tools
        return () if self.writes else WRITE_TOOLS

    @property
    def prompt_id(self) -> str:
        return hashlib.sha256(self.prompt.encode()).hexdigest()[:16]

    def server_config(self) -> ServerConfig:
        now = self.now
        return ServerConfig(clock=lambda: now, id_seed=self.seed)

    def open(self) -> Fork:
        """An isolated store at the pre-run state, with a server and client on it."""
        store = self.snapshot.open()
        server = FhirServer(store, self.world.spec, self.server_config())
        return Fork(self, store, InProcessClient(server, self.snapshot), mark(store))

    def validate(self, final_answer: str | None, changes: list[Change], gold: Gold | None = None,
                 calls: Iterable[Any] = ()) -> Verdict:
        """Judge a final answer, a store diff and the run's tool ``calls`` against ``gold`` (default: the
        instance's own). A right "nothing found" passes only if ``calls`` looked at what it is about
        (:attr:`evidence_types`): no calls, no evidence."""
        fam = self.family
        gold = self.gold if gold is None else gold
        reasons: list[str] = []
        answer_ok: bool | None = None
        unsupported = False
        if fam.answer is not None and gold.answer is not None:
            why = fam.answer.compare(fam.answer.parse(final_answer), gold.answer)
            answer_ok = not why
            reasons += [f"answer: {r}" for r in why]
            if answer_ok and fam.negative(gold) and not looked_at(calls) & set(self.evidence_types):
                unsupported = True
                reasons.append(f"answer: 'nothing found' without a successful search or read of "
                               f"{' or '.join(self.evidence_types)}: a negative claim needs a look at the record")
        m = match(gold.expects, changes)
        for exp, why in m.unmet:
            reasons += [f"missing change: {exp.describe()}: {'; '.join(why)}"]
        collateral = [f"{c.op} {c.key}" for c in m.collateral]
        reasons += [f"collateral write: {c}" for c in collateral]
        success = not reasons
        light = (m.light_ok and bool(changes)) if self.writes else None
        return Verdict(success, light, answer_ok, reasons, collateral, changes, unsupported)

    @cached_property
    def reference(self) -> ReferenceRun:
        """The reference solution run on a private copy: its final text, tool calls and verdict."""
        with self.open() as ep:
            box = ep.toolbox()
            text = self.family.solve(box, self.params, self.now)
            return ReferenceRun(text, box.calls, ep.finish(text, calls=box.calls))

    @property
    def expected_min_calls(self) -> int:
        return len(self.reference.calls)

    def describe(self) -> dict:
        """Everything `fhirgym tasks show` prints."""
        return {"task_id": self.task_id, "category": self.family.category, "difficulty": self.family.difficulty,
                "writes": self.writes, "seed": self.seed, "now": self.now.isoformat(),
                "weekday": self.now.strftime("%A"), "params": render(self.params), "prompt": self.prompt,
                "setup": [f"{r['resourceType']}/{r.get('id')}" for r in self.setup],
                "gold_answer": None if self.gold.answer is None else render(self.gold.answer),
                "expected_changes": [e.describe() for e in self.gold.expects],
                "resource_types": list(self.resource_types),
                "sequences": [list(s) for s in self.sequences],
                "prohibited_tools": list(self.prohibited_tools)}


@dataclass
class Fork:
    """An instance's pre-run state forked onto its own store: client, diff and judge.

    The primitive under :class:`fhirgym.env.Episode` (what agents, the runner, memory and RL drive) and
    under the validators' own proofs (reference runs, mutations); agents never get one.
    """

    instance: Instance
    store: Store
    client: InProcessClient
    start: Mark

    def toolbox(self, tools=FHIR_TOOLS, budget: int | None = None) -> Toolbox:
        ctx = ToolContext(self.client) if budget is None else ToolContext(self.client, budget)
        return Toolbox(tools, ctx)

    def changes(self) -> list[Change]:
        return diff(self.store, self.start)

    def finish(self, final_answer: str | None, gold: Gold | None = None, calls: Iterable[Any] = ()) -> Verdict:
        """The verdict on the store's state now, the final answer and the run's tool ``calls``."""
        return self.instance.validate(final_answer, self.changes(), gold, calls)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Fork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_instance(family: Family | str, seed: int, world: TaskWorld | str | Path, attempts: int = 64) -> Instance:
    """Instantiate ``family`` for ``seed`` on ``world``: params, frozen now, setup, pre-run snapshot, gold."""
    fam = get_family(family) if isinstance(family, str) else family
    tw = world if isinstance(world, TaskWorld) else TaskWorld.open(world)
    label, draw = fam.stream(seed)
    now = frozen_now(tw.anchor, random.Random(f"now|{label}|{draw}"))
    with tw.lock:
        client = tw.scratch(now)
        view = View(tw, client, now, draw, label)
        params = None
        for attempt in range(attempts):
            view.attempt = attempt
            params = fam.sample(view, random.Random(f"{label}|{draw}|{attempt}"))
            if params is not None:
                break
        if params is None:
            raise TaskInfeasible(f"{fam.id}: no fitting entity for seed {seed} after {attempts} draws")
        setup = fam.setup(view, params)
        # one load, at the world's lastUpdated (never after "now"): every setup resource gets exactly the
        # world's timestamp, which neither _lastUpdated nor the default (lastUpdated, id) order tells apart
        tw.clock = tw.last_updated
        try:
            dangling = client.server.load(setup) if setup else []
        except FhirError as err:
            raise RuntimeError(f"{fam.id}: setup rejected: {err}") from err
        finally:
            tw.clock = now
        if dangling:
            raise RuntimeError(f"{fam.id}: setup references missing resources: {[i.diagnostics for i in dangling]}")
        gold = fam.gold(view, params)
        snapshot = client.server.store.snapshot() if setup else tw.snapshot
    return Instance(fam, seed, params, now, fam.full_prompt(params), setup, snapshot, gold, tw)


#: The default subset (`--tasks default`, docs/EVALUATION.md): every category, three reads and three
#: writes, small enough for the README's main command to finish within 15 minutes on a fresh 2-core
#: machine with the local 1.5B model (an episode with tool calls costs it 1–2 minutes of prefill and
#: decoding); `--tasks all` runs every family.
DEFAULT_SUBSET = ("records.find_patient", "billing.find_coverage", "scheduling.book_first_free_slot",
                  "orders.record_surgery_plan", "clinical.last_hba1c", "clinical.record_blood_pressure")


def select(selector: str | None, among: list[Family] | None = None) -> list[Family]:
    """Families matching a selector: comma-separated ids, globs (``scheduling.*``), categories,
    ``reads``/``writes``, ``d1``–``d3``, ``split:train``/``split:eval`` (the held-out split's sides), ``all``
    or ``default``; a leading ``-`` excludes. ``among``:
    the families to choose from (default: the registered ones; the QA track passes its templates')."""
    import fnmatch

    every = families() if among is None else among
    if not selector or selector == "all":
        return every
    chosen: list[Family] = []
    excluded: set[str] = set()
    for raw in (t.strip() for t in selector.split(",")):
        if not raw:
            continue
        neg = raw.startswith("-")
        term = raw[1:] if neg else raw
        if term == "default":
            hits = [f for f in every if f.id in DEFAULT_SUBSET]
        elif term == "all":
            hits = every
        elif term in CATEGORIES:
            hits = [f for f in every if f.category == term]
        elif term in ("reads", "writes"):
            hits = [f for f in every if f.writes == (term == "writes")]
        elif term in ("split:train", "split:eval"):  # a side of the held-out split (tasks.heldout_split)
            side = set(heldout_split()[term.split(":")[1]])
            hits = [f for f in every if f.id in side]
        elif len(term) == 2 and term[0] == "d" and term[1] in "123":
            hits = [f for f in every if f.difficulty == int(term[1])]
        else:
            hits = [f for f in every if fnmatch.fnmatchcase(f.id, term)]
            if not hits:
                raise KeyError(f"no task matches {term!r}; see `fhirgym tasks list`")
        if neg:
            excluded.update(f.id for f in hits)
        else:
            chosen.extend(f for f in hits if f not in chosen)
    if not chosen and excluded:
        chosen = every
    return [f for f in chosen if f.id not in excluded]
