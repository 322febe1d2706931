"""Reflexion memory with scripted models: lessons produced, de-identified, stored, merged, retrieved both
ways, reaching the agent's context; frozen hash in run.json and result lines; malformed replies skipped."""

from __future__ import annotations

import re

import orjson
import pytest

from fhirgym.agents import ReactAgent, ScriptedBackend
from fhirgym.env import Episode
from fhirgym.memory import (
    Lesson,
    MemoryStore,
    MemoryStoreError,
    TrainSpec,
    bound_config,
    deidentify,
    describe,
    prompt_block,
    sensitive_values,
    train_memory,
)
from fhirgym.runner import EvalError, EvalSpec, run_eval
from fhirgym.tasks import TaskWorld, make_instance, render

TRAIN_TASKS = "records.find_patient,billing.find_coverage,scheduling.book_first_free_slot,clinical.patient_mrn"


@pytest.fixture(scope="module")
def world(small_world_path):
    return TaskWorld.open(small_world_path)


def _leaky_evaluator(messages: list[dict]) -> str:
    """A critique that quotes the whole run back (names, dates, ids): the worst case for privacy."""
    return orjson.dumps({"score": 3, "critique": messages[-1]["content"][:2000], "failure_tags": ["tool_errors"],
                         "advice": "Search first."}).decode()


def _backwards(text: str) -> str:
    return " ".join(reversed(text.split()))


def _leaky_reflector(messages: list[dict]) -> str:
    """Lessons that carry every value of the run (the request, the answer, the run log), word for word but
    in reverse order, so that the content check, which drops a restated request, lets them through."""
    text = messages[-1]["content"]
    request = text.split("## Task request\n", 1)[1].split("\n\n## ", 1)[0]
    answer = text.split("## Final answer\n", 1)[1].split("\n\n## ", 1)[0]
    return orjson.dumps({"macro": f"Values seen: {_backwards(request)}; answer {answer}. Run log: "
                                  f"{_backwards(text[:3000])}",
                         "micro": [{"resource_type": "Patient", "operation": "search",
                                    "tip": f"Search Patient by name and birthdate; here: {_backwards(request)}"}]}
                        ).decode()


def _script(n: int, step) -> ScriptedBackend:
    return ScriptedBackend([step] * n)


def _train(world, out, tasks=TRAIN_TASKS, seeds=(0, 1), trials=2, evaluator=None, reflector=None,
           actor=None, with_specs=False):
    actor = actor or _nothing_actor()
    return train_memory(
        TrainSpec(out=out, tasks=tasks, seeds=list(seeds), trials=trials, model="scripted", with_specs=with_specs),
        world, actor=actor, evaluator=evaluator or _script(100, _leaky_evaluator),
        reflector=reflector or _script(100, _leaky_reflector))


def _nothing_actor():
    """An actor that answers with the reference reply's shape but wrong (fails: trial 2 runs)."""
    return ReactAgent(ScriptedBackend(['<answer>{"patient_id": "0000"}</answer>'] * 200))


def _quoting_evaluator(world):
    """A critique that quotes the whole run back and every value of every training instance's params and
    gold (names, ids, dates of birth, member ids): the worst case for privacy. (Setup resources' ids come
    back through the run itself.)"""
    quoted = []
    for task in TRAIN_TASKS.split(","):
        for seed in (0, 1):
            inst = make_instance(task, seed, world)
            quoted.append(orjson.dumps({"params": render(inst.params),
                                        "gold": render(inst.gold.answer) if inst.gold.answer is not None else None
                                        }).decode())

    def critique(messages: list[dict]) -> str:
        return orjson.dumps({"score": 3, "critique": messages[-1]["content"][:2000] + " The right answer was "
                             + " ".join(quoted), "failure_tags": ["tool_errors"], "advice": "Search first."}).decode()
    return critique


def test_training_never_stores_a_value_of_a_training_instance(world, tmp_path):
    """The de-identification test: a scripted training run whose critiques quote the gold and every value of
    the instances, and whose lessons copy the run; then every file of the memory directory is scanned."""
    store = _train(world, tmp_path / "mem", evaluator=_script(100, _quoting_evaluator(world)))
    texts = " ".join(x.text for x in store.lessons)
    assert store.lessons and store.frozen and "<NAME>" in texts
    files = sorted(p for p in (tmp_path / "mem").rglob("*") if p.is_file())
    assert {p.name for p in files} >= {"lessons.jsonl", "memory.json", "training.jsonl", "training.json"}
    log = (tmp_path / "mem" / "training.jsonl").read_text()
    assert "The right answer was" in log and "<NAME>" in log  # the critiques are kept, de-identified
    leaked = []
    for path in files:
        stored = path.read_bytes().decode("utf-8", "replace")
        for task in TRAIN_TASKS.split(","):
            for seed in (0, 1):
                inst = make_instance(task, seed, world)
                answer = render(inst.gold.answer) if inst.gold.answer is not None else None
                for value, kind in sensitive_values(inst.params, answer, inst.setup).items():
                    if re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", stored, re.I):
                        leaked.append((path.name, task, seed, kind, value))
        for ident in re.findall(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", stored):
            leaked.append((path.name, "uuid", ident))
        when = re.sub(r'"time": ?"[^"]*"', "", stored)  # when a run was trained: not an instance's value
        assert not re.findall(r"\b\d{4}-\d{2}-\d{2}\b", when), (path.name, "an ISO date reached it")
    assert not leaked, leaked[:5]


def test_lessons_carry_provenance_and_near_duplicates_merge(world, tmp_path):
    store = _train(world, tmp_path / "mem", tasks="records.find_patient", seeds=(0, 1), trials=2)
    log = [orjson.loads(x) for x in (tmp_path / "mem" / "training.jsonl").read_bytes().splitlines()]
    assert [(r["seed"], r["trial"]) for r in log] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert [r["saw_lessons"] for r in log] == [False, True, False, True]
    micro = [x for x in store.lessons if x.kind == "micro"]
    # the same (de-identified) tip from 4 runs: one lesson, four provenances
    assert len(micro) == 1 and len(micro[0].provenance) == 4
    p = micro[0].provenance[0]
    assert {"family", "seed", "trial", "outcome", "models", "time"} <= set(p) and p["models"]["actor"] == "scripted"
    assert store.counts()["merged"] >= 3
    out = describe(store)
    assert "micro tips by resource type" in out and "Patient" in out and store.content_hash in out


def test_trial_two_sees_the_lessons_of_trial_one(world, tmp_path):
    actor_backend = ScriptedBackend(['<answer>{"patient_id": "0000"}</answer>'] * 10)
    reflector = _script(10, lambda m: orjson.dumps({"macro": "Always search Patient by family and birthdate "
                                                             "before answering.", "micro": []}).decode())
    _train(world, tmp_path / "mem", tasks="records.find_patient", seeds=(0,), trials=2,
           actor=ReactAgent(actor_backend), reflector=reflector)
    first, second = actor_backend.requests[0].messages[0]["content"], actor_backend.requests[1].messages[0]["content"]
    assert "Always search Patient by family" not in first
    assert "Always search Patient by family" in second


def test_early_stop_on_success(world, tmp_path):
    inst = make_instance("records.find_patient", 0, world)
    call = {"name": "searchResources", "arguments": {"resourceType": "Patient", "params": {
        "given": inst.params["name"].split()[0], "family": inst.params["name"].split()[-1],
        "birthdate": inst.params["birth_date"]}}}

    def answer(messages):
        return f'<answer>{{"patient_id": "{re.search(chr(34) + "id" + chr(34) + ":" + chr(34) + "([^" + chr(34) + "]+)", messages[-1]["content"]).group(1)}"}}</answer>'

    actor = ReactAgent(ScriptedBackend([f"<tool_call>{orjson.dumps(call).decode()}</tool_call>", answer]))
    _train(world, tmp_path / "mem", tasks="records.find_patient", seeds=(0,), trials=2, actor=actor)
    log = [orjson.loads(x) for x in (tmp_path / "mem" / "training.jsonl").read_bytes().splitlines()]
    assert [(r["trial"], r["outcome"]) for r in log] == [(1, "pass")]


def test_malformed_output_is_retried_once_then_skipped(world, tmp_path):
    good = orjson.dumps({"score": 5, "critique": "ok", "failure_tags": [], "advice": "search first"}).decode()
    evaluator = ScriptedBackend(["not json", good, "still not json", "nor this"])  # run 1: retry works; run 2: skip
    reflector = ScriptedBackend(['{"macro": ""}', '{"macro": "Search before you answer.", "micro": []}'])
    store = _train(world, tmp_path / "mem", tasks="records.find_patient", seeds=(0,), trials=2,
                   evaluator=evaluator, reflector=reflector)
    log = [orjson.loads(x) for x in (tmp_path / "mem" / "training.jsonl").read_bytes().splitlines()]
    assert "skipped" not in log[0] and log[0]["lessons"] == 1
    assert log[1]["skipped"]["stage"] == "evaluator"
    assert [x.text for x in store.lessons] == ["Search before you answer."]


def test_with_specs_the_reflector_checks_the_spec_and_cites_paths(world, tmp_path):
    lookup = ('<tool_call>{"name": "getStructureDefinition", "arguments": {"resourceType": "Patient", '
              '"path": "Patient.birthDate"}}</tool_call>')
    final = orjson.dumps({"macro": "Search the patient by birthdate.", "micro": [
        {"resource_type": "Patient", "operation": "search", "tip": "birthdate is a date search parameter.",
         "spec_paths": ["Patient.birthDate", "Observation.code"]}]}).decode()
    store = _train(world, tmp_path / "mem", tasks="records.find_patient", seeds=(0,), trials=1,
                   reflector=ScriptedBackend([lookup, final]), with_specs=True)
    [tip] = [x for x in store.lessons if x.kind == "micro"]
    assert tip.spec_paths == ["Patient.birthDate"]  # cited and checked; the unchecked path is dropped


def test_retrieval_both_ways_reaches_the_agent_and_the_hash_reaches_the_results(world, tmp_path):
    store = MemoryStore(tmp_path / "mem")
    store.add(Lesson("macro", "To book an appointment, search free Slots of the schedule first, then create the "
                              "Appointment and mark the Slot busy."))
    store.add(Lesson("macro", "For lab values, search Observation by patient and LOINC code, sorted by date."))
    store.add(Lesson("micro", "Slot search: use schedule.actor and status=free.", "Slot", "search"))
    digest = store.freeze()
    with pytest.raises(MemoryStoreError):
        store.add(Lesson("macro", "too late"))
    top = store.search("book the first free slot with a doctor", 1)
    assert "book an appointment" in top[0]["text"]
    assert store.tips("Slot", "search")[0]["text"].startswith("Slot search") and store.tips("Slot", "read") == []

    inst = make_instance("scheduling.book_first_free_slot", 0, world)
    block = prompt_block(store, inst)
    assert "book an appointment" in block and "Slot search" in block
    assert prompt_block(store, inst, budget=30).count("\n- ") < block.count("\n- ")  # the budget cuts whole lessons

    # prompt mode: the lessons are in the system prompt the model gets
    backend = ScriptedBackend(["<answer>{}</answer>"])
    prompt_cfg = bound_config("memory", tmp_path / "mem", "prompt")
    [line] = run_eval(EvalSpec(out=tmp_path / "p", agent="react", model="scripted", config="memory",
                               tasks="scheduling.book_first_free_slot"), world, agent=ReactAgent(backend),
                      config=prompt_cfg)
    assert "book an appointment" in backend.requests[0].messages[0]["content"]
    assert line["memory"] == digest
    assert orjson.loads((tmp_path / "p" / "run.json").read_bytes())["labels"]["memory"] == digest

    # tools mode: the agent calls the memory tools; their output comes back into its context
    call = '<tool_call>{"name": "searchMemory", "arguments": {"query": "book a slot", "k": 1}}</tool_call>'
    backend = ScriptedBackend([call, "<answer>{}</answer>"])
    [line] = run_eval(EvalSpec(out=tmp_path / "t", agent="react", model="scripted", config="memory-specs+specs",
                               tasks="scheduling.book_first_free_slot"), world, agent=ReactAgent(backend),
                      config=bound_config("memory-specs+specs", tmp_path / "mem", "tools"))
    assert "book an appointment" in backend.requests[1].messages[-1]["content"]
    assert line["memory"] == digest and line["tool_calls"][0]["name"] == "searchMemory"
    names = {t["function"]["name"] for t in backend.requests[0].tools}
    assert {"searchMemory", "getMemoryTips", "getStructureDefinition", "searchResources"} <= names


def test_unbound_memory_configs_and_tampered_stores_are_refused(world, tmp_path):
    with pytest.raises(EvalError, match="--memory"):
        run_eval(EvalSpec(out=tmp_path / "x", agent="null", config="memory", tasks="records.find_patient"), world)
    with pytest.raises(ValueError, match="--memory"):
        Episode(make_instance("records.find_patient", 0, world), "memory")
    store = MemoryStore(tmp_path / "mem")
    store.add(Lesson("macro", "Search first."))
    with pytest.raises(MemoryStoreError, match="not frozen"):
        bound_config("memory", tmp_path / "mem")
    store.freeze()
    (tmp_path / "mem" / "lessons.jsonl").write_text((tmp_path / "mem" / "lessons.jsonl").read_text().replace(
        "Search first.", "Delete everything."))
    with pytest.raises(MemoryStoreError, match="hash mismatch"):
        bound_config("memory", tmp_path / "mem")


def test_deidentify_patterns():
    values = sensitive_values({"name": "Maria Diaz", "birth_date": "1970-03-02", "member_id": "XK-99812",
                               "phone": "555-201-3344", "status": "booked"}, {"count": 7})
    text = ("Maria Diaz (born 1970-03-02, Diaz family) member XK-99812 phone (555) 201-3344 has 7 slots; "
            "status booked; Patient/8f0c2d1e-1111-4222-8333-944445555666 at 2024-06-01T09:30:00Z")
    out = deidentify(text, values)
    for leaked in ("Maria", "Diaz", "1970", "XK-99812", "3344", "8f0c2d1e", "09:30", " 7 "):
        assert leaked not in out, (leaked, out)
    assert "booked" in out and "<MEMBER_ID>" in out and "<NAME>" in out and "<DATE>" in out
