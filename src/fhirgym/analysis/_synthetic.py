"""A seeded, synthetic results directory in the docs/RESULTS.md format.

For the report's tests and for looking at a report without running an agent: every field of the
contract is filled with plausible values (success drawn from a per-config skill and a per-task
difficulty), and transcripts carry messages, full tool outputs, a store diff and a verdict.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from ._metrics import FAILURE_MODES

TASKS = [
    ("records.create_patient", "records", 1, True, 2, "Patient"),
    ("records.find_patient", "records", 1, False, 1, "Patient"),
    ("billing.add_coverage", "billing", 3, True, 5, "Coverage"),
    ("billing.find_guarantor", "billing", 2, False, 2, "Account"),
    ("scheduling.book_first_free_slot", "scheduling", 2, True, 4, "Slot"),
    ("scheduling.count_free_slots", "scheduling", 2, False, 2, "Slot"),
    ("orders.surgery_plan", "orders", 3, True, 3, "ServiceRequest"),
    ("clinical.record_condition", "clinical", 1, True, 2, "Condition"),
]
TOOLS = ["searchResources", "getResourceById", "createResource", "updateResource"]


def write_synthetic_results(
    out: Path,
    configs: dict[str, float] | None = None,
    *,
    seeds: int = 2,
    paraphrases: int = 2,
    runs: int = 3,
    setting: str = "default",
    seed: int = 0,
    error_every: int = 0,
    drop_transcripts: int = 0,
) -> Path:
    """Write ``results.jsonl``, ``run.json`` and transcripts for ``configs`` (name → skill in [0, 1]).

    ``error_every=n`` turns every n-th episode into an infrastructure error; ``drop_transcripts=n``
    deletes the first n transcripts (the report must tolerate it). Returns ``out``.
    """
    configs = configs or {"baseline": 0.5, "specs": 0.6}
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps({"agent": "react", "model": "synthetic/model", "runs": runs,
                                              "config": list(configs), "setting": setting}))
    lines = []
    count = 0
    for config, skill in configs.items():
        for task_id, category, difficulty, writes, expected, rtype in TASKS:
            for s in range(seeds):
                for p in range(paraphrases):
                    prompt = f"[{task_id}] variation {s}, phrasing {p}: please do the task <now>."
                    p_var = min(0.95, max(0.05, skill + 0.15 * (2 - difficulty) + rng.uniform(-0.2, 0.2)))
                    for run in range(runs):
                        count += 1
                        ep = f"{config}/{task_id}/s{s}/p{p}/r{run}"
                        rec = _episode(rng, ep, task_id, category, difficulty, writes, expected, rtype, s, p,
                                       run, config, setting, prompt, p_var,
                                       error=bool(error_every and count % error_every == 0))
                        transcript = _transcript(rng, rec, prompt, rtype)
                        tpath = out / rec["transcript"]
                        tpath.parent.mkdir(parents=True, exist_ok=True)
                        tpath.write_text(json.dumps(transcript, indent=1))
                        lines.append(json.dumps(rec))
    (out / "results.jsonl").write_text("\n".join(lines) + "\n")
    for rec_line in lines[:drop_transcripts]:
        (out / json.loads(rec_line)["transcript"]).unlink()
    return out


def _episode(rng: random.Random, ep: str, task_id: str, category: str, difficulty: int, writes: bool,
             expected: int, rtype: str, s: int, p: int, run: int, config: str, setting: str, prompt: str,
             p_success: float, *, error: bool) -> dict[str, Any]:
    success = rng.random() < p_success
    n_calls = max(1, expected + rng.randint(-1, 3) + (0 if success else rng.randint(0, 3)))
    calls = []
    for i in range(n_calls):
        name = rng.choice(TOOLS[:2]) if i < n_calls - 1 or not writes else rng.choice(TOOLS[2:])
        err = "HTTP 400: unknown search parameter 'nam'" if rng.random() < (0.05 if success else 0.25) else None
        calls.append({"name": name, "arguments": {"resourceType": rtype, "params": {"_count": 10}},
                      "output_summary": err or "Bundle (3 entries)", "error": err,
                      "resource_type": rtype if name != "getResourceById" else "Patient",
                      "ms": round(rng.uniform(1, 20), 2)})
    modes = [] if success else rng.sample(FAILURE_MODES, rng.randint(1, 2))
    status = "error" if error else ("pass" if success else "fail")
    prompt_tokens = int(900 * n_calls * rng.uniform(0.8, 1.2)) + 600
    return {
        "episode_id": ep, "task_id": task_id, "category": category, "difficulty": difficulty, "writes": writes,
        "seed": s, "paraphrase": p, "prompt_id": hashlib.sha256(prompt.encode()).hexdigest()[:16], "run": run,
        "config": config, "setting": setting, "agent": "react", "model": "synthetic/model", "status": status,
        "success": None if error else success,
        "light_success": None if error or not writes else (success or rng.random() < 0.4),
        "reasons": [] if success or error else ["Slot/slot-3 is still free", "answer did not name the slot"],
        "failure_modes": [] if error else modes,
        "proximity": {"lcs": round(rng.random(), 3), "jaccard": round(rng.random(), 3)},
        "expected_min_calls": expected, "tool_calls": calls,
        "tokens": {"prompt": prompt_tokens, "completion": int(prompt_tokens * rng.uniform(0.05, 0.15))},
        "iterations": n_calls + 1, "stop_reason": "error" if error else "answered",
        "final_answer": None if error else "Booked slot-2 <b>for</b> Mr & Mrs Smith",
        "duration_s": round(rng.uniform(2, 30), 2), "sandbox_s": round(rng.uniform(0.01, 0.5), 3),
        "error": "model server timed out" if error else None,
        "transcript": f"transcripts/{ep}.json",
    }


def _transcript(rng: random.Random, rec: dict[str, Any], prompt: str, rtype: str) -> dict[str, Any]:
    before = {"resourceType": rtype, "id": "x1", "status": "free", "meta": {"versionId": "1"}}
    after = {**before, "status": "busy", "meta": {"versionId": "2"}}
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a FHIR agent."},
                                  {"role": "user", "content": prompt}]
    full_calls = []
    for i, c in enumerate(rec["tool_calls"]):
        msgs.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{i}", "name": c["name"], "arguments": c["arguments"]}]})
        output = c["error"] or json.dumps({"resourceType": "Bundle", "total": 3,
                                           "entry": [{"resource": before}] * 3}, indent=1)
        msgs.append({"role": "tool", "name": c["name"], "content": output})
        full_calls.append({**c, "output": output})
    msgs.append({"role": "assistant", "content": rec["final_answer"] or ""})
    return {
        **rec,
        "prompt": prompt, "system": "You are a FHIR agent. <Answer> in the format ANSWER: ...",
        "now": "2025-06-02T09:00:00Z", "params": {"patient": "Patient/p1", "days": rng.randint(3, 14)},
        "gold_answer": "slot-2", "expected_changes": [f"{rtype}/x1 status free → busy"],
        "messages": msgs, "tool_calls": full_calls,
        "diff": [{"op": "update", "type": rtype, "id": "x1", "before": before, "after": after},
                 {"op": "create", "type": "Appointment", "id": "a9", "before": None,
                  "after": {"resourceType": "Appointment", "id": "a9", "status": "booked"}}] if rec["writes"] else [],
        "verdict": {"success": rec["success"], "light_success": rec["light_success"],
                    "answer_ok": rec["success"], "reasons": rec["reasons"], "collateral": []},
    }
