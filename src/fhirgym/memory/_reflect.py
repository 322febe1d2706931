"""The two LLM steps after every training run: the evaluator's critique and the reflector's lessons.

Both speak structured JSON (prompts in ``memory/prompts/``, docs/MEMORY.md). A reply that is not the JSON
asked for is retried once with the parse error; a second bad reply raises :class:`Malformed`, which the
training loop records as a skipped reflection, never a crash. With specs, the reflector may first call
the FHIR-spec tools (a few rounds), and the element paths it looked up are cited in its micro tips.
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import Any

import orjson

from ..agents import ChatBackend
from ..tasks import MODES
from ..tools import SPEC_TOOLS, Toolbox, ToolContext

OPERATIONS = ("search", "read", "create", "update", "delete")
SPEC_ROUNDS = 4
#: Characters of one spec-tool output the reflector reads: on a CPU model each round's prefill is the cost
SPEC_OUTPUT_CHARS = 1500
#: A critique or a lesson set is a few sentences of JSON; with 1,024 one malformed reflection (reply, retry)
#: of the 0.5B model took 13.5 min on 2 busy cores
REPLY_TOKENS = 700


class Malformed(ValueError):
    """The model's reply, after one retry, was not the JSON object asked for."""


def prompt_text(name: str) -> str:
    return files("fhirgym.memory").joinpath("prompts", f"{name}.md").read_text()


def prompts_digest() -> str:
    import hashlib

    return hashlib.sha256("".join(prompt_text(n) for n in ("evaluator", "reflector", "reflector_specs"))
                          .encode()).hexdigest()[:16]


def _json_object(text: str) -> dict:
    text = (text or "").strip()
    fenced = re.search(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.S)
    if fenced:
        text = fenced.group(1)
    else:
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end <= start:
            raise ValueError("no JSON object in the reply")
        text = text[start:end + 1]
    value = orjson.loads(text)
    if not isinstance(value, dict):
        raise ValueError("the reply is not a JSON object")
    return value


def _check_critique(value: dict) -> dict:
    score = value.get("score")
    if not isinstance(score, int | float) or not 0 <= score <= 10:
        raise ValueError("score must be a number from 0 to 10")
    for key in ("critique", "advice"):
        if not isinstance(value.get(key), str) or not value[key].strip():
            raise ValueError(f"{key} must be a non-empty string")
    tags = value.get("failure_tags", [])
    if not isinstance(tags, list) or any(t not in MODES for t in tags):
        raise ValueError(f"failure_tags must be a list of {', '.join(MODES)}")
    return {"score": score, "critique": value["critique"].strip(), "failure_tags": tags,
            "advice": value["advice"].strip()}


def _check_lessons(value: dict) -> dict:
    macro = value.get("macro")
    if not isinstance(macro, str) or not macro.strip():
        raise ValueError("macro must be a non-empty string")
    micro = value.get("micro", [])
    if not isinstance(micro, list):
        raise ValueError("micro must be a list")
    tips = []
    for tip in micro:
        if not isinstance(tip, dict) or not all(isinstance(tip.get(k), str) and tip[k].strip()
                                                for k in ("resource_type", "operation", "tip")):
            raise ValueError("each micro tip needs resource_type, operation and tip strings")
        if tip["operation"] not in OPERATIONS:
            raise ValueError(f"operation must be one of {', '.join(OPERATIONS)}")
        paths = tip.get("spec_paths", [])
        tips.append({"resource_type": tip["resource_type"].strip(), "operation": tip["operation"],
                     "tip": tip["tip"].strip(),
                     "spec_paths": [p for p in paths if isinstance(p, str)] if isinstance(paths, list) else []})
    return {"macro": macro.strip(), "micro": tips}


class Usage:
    """Tokens spent by the evaluator and reflector (training cost)."""

    def __init__(self) -> None:
        self.prompt = 0
        self.completion = 0
        self.calls = 0

    def add(self, reply: Any) -> None:
        self.prompt += reply.prompt_tokens
        self.completion += reply.completion_tokens
        self.calls += 1


def _ask(backend: ChatBackend, messages: list[dict], check, usage: Usage, tools: list[dict] | None = None,
         toolbox: Toolbox | None = None) -> tuple[dict, list[dict]]:
    """One structured reply (tool rounds first, when tools are given); one retry on a malformed reply."""
    consulted: list[dict] = []
    for _ in range(SPEC_ROUNDS if toolbox else 0):
        reply = backend.chat(messages, tools, temperature=0.0, max_tokens=_reply_tokens(backend), seed=0)
        usage.add(reply)
        if not reply.tool_calls:
            messages.append({"role": "assistant", "content": reply.text or ""})
            break
        calls = [{"id": f"r{len(consulted)}_{i}", "type": "function",
                  "function": {"name": c.name, "arguments": orjson.dumps(c.arguments).decode()}}
                 for i, c in enumerate(reply.tool_calls)]
        messages.append({"role": "assistant", "content": reply.text or "", "tool_calls": calls})
        for c, msg in zip(reply.tool_calls, calls, strict=True):
            done = toolbox.call(c.name, c.arguments)
            consulted.append({"name": c.name, "arguments": c.arguments, "error": done.error})
            messages.append({"role": "tool", "tool_call_id": msg["id"], "name": c.name,
                             "content": done.summary(SPEC_OUTPUT_CHARS)})
    else:
        reply = backend.chat(messages, None, temperature=0.0, max_tokens=_reply_tokens(backend), seed=0)
        usage.add(reply)
        messages.append({"role": "assistant", "content": reply.text or ""})
    problem = ""
    for attempt in range(2):
        try:
            return check(_json_object(messages[-1]["content"])), consulted
        except (ValueError, orjson.JSONDecodeError) as exc:
            problem = str(exc)
        if attempt == 0:
            messages.append({"role": "user", "content": f"Your reply was not the JSON object asked for ({problem}). "
                                                        "Reply with that JSON object only."})
            reply = backend.chat(messages, None, temperature=0.0, max_tokens=_reply_tokens(backend), seed=0)
            usage.add(reply)
            messages.append({"role": "assistant", "content": reply.text or ""})
    raise Malformed(problem)


def _reply_tokens(backend: ChatBackend) -> int:
    """The reply cap: ours, or less where the backend can afford less (a local CPU model)."""
    return min(REPLY_TOKENS, getattr(backend, "max_reply_tokens", None) or REPLY_TOKENS)


def run_digest(transcript: dict) -> str:
    """What the evaluator and reflector read of a run: request, metadata, calls, answer, verdict."""
    calls = [{"name": c["name"], "arguments": c["arguments"], "error": c.get("error"),
              "output": c.get("output_summary")} for c in transcript["tool_calls"]]
    meta = {k: transcript.get(k) for k in ("task_id", "category", "difficulty", "writes", "expected_min_calls")}
    verdict = {"success": transcript["success"], "reasons": transcript["reasons"],
               "failure_modes": transcript["failure_modes"], "stop_reason": transcript["stop_reason"]}
    return "\n\n".join([
        f"## Task request\n{transcript['prompt']}", f"## Task metadata\n{orjson.dumps(meta).decode()}",
        f"## Tool calls ({len(calls)})\n" + "\n".join(orjson.dumps(c, default=str).decode() for c in calls),
        f"## Final answer\n{transcript['final_answer']}", f"## Validator verdict\n{orjson.dumps(verdict).decode()}"])


def evaluate(backend: ChatBackend, digest: str, usage: Usage) -> dict:
    messages = [{"role": "system", "content": prompt_text("evaluator")}, {"role": "user", "content": digest}]
    return _ask(backend, messages, _check_critique, usage)[0]


def reflect(backend: ChatBackend, digest: str, critique: dict, usage: Usage, with_specs: bool) -> dict:
    system = prompt_text("reflector") + ("\n\n" + prompt_text("reflector_specs") if with_specs else "")
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": f"{digest}\n\n## Evaluator critique\n{orjson.dumps(critique).decode()}"}]
    toolbox = Toolbox(SPEC_TOOLS, ToolContext(None)) if with_specs else None
    lessons, consulted = _ask(backend, messages, _check_lessons, usage,
                              [t.openai_schema() for t in SPEC_TOOLS] if with_specs else None, toolbox)
    checked = _checked_paths(consulted)
    for tip in lessons["micro"]:  # cite what was looked up for this tip's resource type
        cited = {p for p in tip["spec_paths"] if p.split(".")[0] in checked}
        cited |= {p for p in checked.get(tip["resource_type"], ())}
        tip["spec_paths"] = sorted(cited) if with_specs else []
    lessons["consulted"] = consulted
    return lessons


def _checked_paths(consulted: list[dict]) -> dict[str, set[str]]:
    """resource type → element paths (or the type itself) the reflector looked up without error."""
    out: dict[str, set[str]] = {}
    for c in consulted:
        if c["error"]:
            continue
        args = c["arguments"]
        rtype = args.get("resourceType") or args.get("resource_type") or args.get("type") or args.get("name")
        if isinstance(rtype, str) and rtype:
            path = args.get("path") or args.get("element")
            out.setdefault(rtype.split(".")[0], set()).add(path if isinstance(path, str) and path else rtype)
    return out
