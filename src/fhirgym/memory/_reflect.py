"""The two LLM steps after every training run: the evaluator's critique and the reflector's lessons.

Both speak structured JSON (prompts in ``memory/prompts/``), and each reply is generated under its JSON schema
(:data:`CRITIQUE_SCHEMA`, :func:`lessons_schema`) wherever the backend can hold a reply to one (its
``structured_output``, behind the agent's ``FHIRGYM_CONSTRAIN`` on OpenAI-compatible endpoints); elsewhere the schema is
only asked for in the prompt. Either way the reply is parsed and checked: one that is not the JSON asked for is retried
once with the parse error; a second bad reply raises :class:`Malformed`, which the training loop records as a skipped
reflection, never a crash. A parsed lesson is then checked for content (:func:`lesson_problem`); a failing lesson is not
stored but returned under ``rejected`` with the reason. With specs, the reflector may first call the FHIR-spec tools and
cites the element paths it looked up. Backends and rules: docs/MEMORY.md, section "Training".
"""

from __future__ import annotations

import functools
import re
import time
from collections import Counter
from importlib.resources import files
from typing import Any

import orjson

from ..agents import ChatBackend
from ..spec import load_spec
from ..tasks import MODES
from ..tools import SPEC_TOOLS, Toolbox, ToolContext

OPERATIONS = ("search", "read", "create", "update", "delete")
MAX_TIPS = 3
SPEC_ROUNDS = 4
#: Characters of one spec-tool output the reflector reads: on a CPU model each round's prefill is the cost
SPEC_OUTPUT_CHARS = 1500
#: A critique or a lesson set is a few sentences of JSON; with 1,024 one malformed reflection (reply, retry)
#: of the 0.5B model took 13.5 min on 2 busy cores
REPLY_TOKENS = 700
#: The reply cap under a schema: the schema's strings are bounded (below), so a constrained reply ends by
#: itself; the cap only has to be above its length (~1 token per character of ASCII text, at worst)
SCHEMA_REPLY_TOKENS = 3_072


class Malformed(ValueError):
    """The model's reply, after one retry, was not the JSON object asked for."""


def _text(low: int, high: int) -> dict:
    """A JSON string of ``low``–``high`` characters that starts with a letter and holds no quote, backslash or
    control character: bounded (a reply under a grammar ends), never blank, and a grammar from its pattern
    writes no escapes (which llama-cpp-python's pattern converter would not produce correctly)."""
    return {"type": "string", "pattern": f'^[A-Za-z][^"\\\\\\x00-\\x1f]{{{low - 1},{high - 1}}}$'}


#: The evaluator's reply (the shape its prompt asks for). Every property is required and none other is
#: allowed: OpenAI's strict structured outputs accept only such schemas.
CRITIQUE_SCHEMA = {
    "type": "object",
    "properties": {
        "score": {"type": "integer", "enum": list(range(11))},
        "critique": _text(10, 400),
        "failure_tags": {"type": "array", "items": {"type": "string", "enum": list(MODES)}, "maxItems": len(MODES)},
        "advice": _text(10, 300),
    },
    "required": ["score", "critique", "failure_tags", "advice"],
    "additionalProperties": False,
}


@functools.lru_cache(maxsize=2)
def lessons_schema(with_specs: bool) -> dict:
    """The reflector's reply: a macro lesson and up to three micro tips keyed by an R4 resource type (the
    146 of the specification) and an operation; with specs, each tip cites the element paths it relied on."""
    tip: dict[str, Any] = {"resource_type": {"type": "string", "enum": list(load_spec().resource_types)},
                           "operation": {"type": "string", "enum": list(OPERATIONS)},
                           "tip": _text(10, 300)}
    if with_specs:
        tip["spec_paths"] = {"type": "array", "maxItems": 4,
                             "items": {"type": "string", "pattern": "^[A-Z][A-Za-z]{1,40}([.][a-z][A-Za-z]{0,40}){0,3}$"}}
    return {
        "type": "object",
        "properties": {
            "macro": _text(20, 500),
            "micro": {"type": "array", "maxItems": MAX_TIPS, "items": {
                "type": "object", "properties": tip, "required": list(tip), "additionalProperties": False}},
        },
        "required": ["macro", "micro"],
        "additionalProperties": False,
    }


def prompt_text(name: str) -> str:
    return files("fhirgym.memory").joinpath("prompts", f"{name}.md").read_text()


def prompts_digest() -> str:
    """What decides how a run is reflected on: the prompts, the reply schemas and the content check's
    parameters (part of a memory's cache key)."""
    import hashlib

    parts = [prompt_text(n) for n in ("evaluator", "reflector", "reflector_specs")]
    parts += [orjson.dumps(x, option=orjson.OPT_SORT_KEYS).decode() for x in (
        CRITIQUE_SCHEMA, lessons_schema(False), lessons_schema(True),
        [MIN_TEXT_SHARE, MIN_WORDS, RESTATED_SHARE, RESTATED_MIN_SHARED, SPAN, sorted(_STOPWORDS)])]
    return hashlib.sha256("".join(parts).encode()).hexdigest()[:16]


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
    return {"score": score, "critique": value["critique"].strip(), "failure_tags": list(dict.fromkeys(tags)),
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


# ---------------------------------------------------------------- the content check of a lesson

#: A lesson is written text: at least this share of its characters are ASCII letters, digits, spaces or
#: punctuation (the prompts and the agents are English; what a random or broken model writes under a
#: grammar is not)
MIN_TEXT_SHARE = 0.8
#: ... with at least this many words (whitespace-separated tokens holding two ASCII letters in a row)
MIN_WORDS = 4
#: ... and is "the prompt restated" when at least this share of its content words, and at least
#: RESTATED_MIN_SHARED of them, occur in one passage of the prompt (a sentence, a bullet or a field
#: description such as "<the macro lesson, 1-4 sentences>"), or when it copies SPAN consecutive words of
#: the prompt; it "repeats itself" when SPAN consecutive words occur in it twice (a decoding loop)
RESTATED_SHARE = 0.8
RESTATED_MIN_SHARED = 3
SPAN = 6
_STOPWORDS = frozenset({"a", "an", "the", "and", "or", "but", "nor", "of", "to", "in", "on", "at", "by",
    "for", "with", "from", "into", "onto", "as", "is", "are", "was", "were", "be", "been", "being", "it",
    "its", "this", "that", "these", "those", "there", "here", "then", "than", "so", "such", "not", "no",
    "do", "does", "did", "done", "can", "could", "should", "would", "will", "may", "might", "must",
    "shall", "you", "your", "yours", "we", "our", "they", "their", "them", "he", "she", "his", "her", "if",
    "when", "where", "which", "who", "whom", "what", "how", "why", "all", "any", "each", "every", "some",
    "one", "ones", "also", "only", "just", "very", "more", "most", "other", "else"})


_PUNCTUATION = frozenset(".,;:!?'\"()[]{}<>/|=+-_*&%#@$~^`")


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]{2,}", text.lower())


def _spans(text: str) -> list[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", text.lower())
    return [tuple(words[i:i + SPAN]) for i in range(len(words) - SPAN + 1)]


@functools.lru_cache(maxsize=8)
def prompt_passages(*names: str) -> tuple[tuple[tuple[str, frozenset[str]], ...], frozenset[tuple[str, ...]]]:
    """What of the named prompts a lesson must not restate: their passages (every field description of the
    JSON template, the text between ``<`` and ``>``; every bullet and every sentence), each with its content
    words, and every run of :data:`SPAN` consecutive words."""
    return text_passages(*(prompt_text(name) for name in names))


def text_passages(*texts: str) -> tuple[tuple[tuple[str, frozenset[str]], ...], frozenset[tuple[str, ...]]]:
    """:func:`prompt_passages` of any texts (the task request a run was given, too)."""
    out: list[str] = []
    spans: set[tuple[str, ...]] = set()
    for text in texts:
        out += re.findall(r"<([^<>]+)>", text)
        for block in re.split(r"\n(?=- )|\n\n", re.sub(r"<[^<>]+>", " ", text)):
            out += [s for s in re.split(r"(?<=[.;:!?])\s+", " ".join(block.split())) if s]
        spans.update(_spans(text))
    return tuple((p, frozenset(_words(p)) - _STOPWORDS) for p in out), frozenset(spans)


def lesson_problem(text: str, prompt: tuple[tuple[tuple[str, frozenset[str]], ...], frozenset[tuple[str, ...]]]
                   ) -> str | None:
    """Why ``text`` is no lesson (None: it is one), ``prompt`` being :func:`prompt_passages`: not written
    text (:data:`MIN_TEXT_SHARE`), fewer than :data:`MIN_WORDS` words, the prompt restated (most of its
    content words from one passage, or :data:`SPAN` words copied), or a loop (a span of it twice)."""
    passages, prompt_spans = prompt
    written = sum(c.isascii() and (c.isalnum() or c.isspace() or c in _PUNCTUATION) for c in text)
    if written < MIN_TEXT_SHARE * len(text):
        return f"not written text: {written} of its {len(text)} characters are letters, digits, spaces or punctuation"
    words = [w for w in text.split() if re.search(r"[A-Za-z]{2}", w)]
    if len(words) < MIN_WORDS:
        return f"too short: {len(words)} word(s), a lesson needs {MIN_WORDS}"
    content = set(_words(text)) - _STOPWORDS
    for passage, theirs in passages:
        shared = content & theirs
        if len(shared) >= RESTATED_MIN_SHARED and len(shared) >= RESTATED_SHARE * len(content):
            return (f"restates the prompt: {len(shared)} of its {len(content)} content words are in "
                    f"the prompt's {passage[:80]!r}")
    seen: set[tuple[str, ...]] = set()
    for span in _spans(text):
        if span in prompt_spans:
            return f"restates the prompt: copies {' '.join(span)!r}"
        if span in seen:
            return f"repeats itself: {' '.join(span)!r} twice"
        seen.add(span)
    return None


def _gist(tip: dict) -> str:
    """A tip's text without its own resource type's name: one text written for several types is one gist."""
    return " ".join(tip["tip"].replace(tip["resource_type"], "").split()).lower()


def screen_lessons(lessons: dict, with_specs: bool, request: str | None = None) -> list[dict]:
    """Drop from ``lessons`` (in place) what is no lesson; return the dropped ones with their reasons. A lesson
    must not restate the prompts nor the run's task ``request`` either; a tip beyond the third, keyed by
    something that is not an R4 resource type, or written for several (type, operation) pairs alike (the
    same words but the type's name: about none of them) is dropped too."""
    prompt = prompt_passages("evaluator", "reflector", *(("reflector_specs",) if with_specs else ()))
    if request:
        task = text_passages(request)
        prompt = (prompt[0] + task[0], prompt[1] | task[1])
    rejected = []
    copies = Counter(_gist(tip) for tip in lessons["micro"][:MAX_TIPS])
    problem = lesson_problem(lessons["macro"], prompt)
    if problem:
        rejected.append({"kind": "macro", "text": lessons["macro"], "reason": problem})
        lessons["macro"] = None
    types = set(load_spec().resource_types)
    kept = []
    for i, tip in enumerate(lessons["micro"]):
        same = copies[_gist(tip)]
        problem = (f"beyond the {MAX_TIPS} tips asked for" if i >= MAX_TIPS else
                   f"not an R4 resource type: {tip['resource_type']!r}" if tip["resource_type"] not in types else
                   f"the same tip for {same} pairs: about none of them" if same > 1 else
                   lesson_problem(tip["tip"], prompt))
        if problem:
            rejected.append({"kind": "micro", "text": tip["tip"], "resource_type": tip["resource_type"],
                             "operation": tip["operation"], "reason": problem})
        else:
            kept.append(tip)
    lessons["micro"] = kept
    return rejected


# ---------------------------------------------------------------- asking


class Usage:
    """Calls, tokens and seconds spent by the evaluator or the reflector (training cost)."""

    def __init__(self) -> None:
        self.prompt = 0
        self.completion = 0
        self.calls = 0
        self.seconds = 0.0

    def add(self, reply: Any, seconds: float = 0.0) -> None:
        self.prompt += reply.prompt_tokens
        self.completion += reply.completion_tokens
        self.calls += 1
        self.seconds += seconds

    def as_dict(self) -> dict:
        return {"calls": self.calls, "prompt_tokens": self.prompt, "completion_tokens": self.completion,
                "seconds": round(self.seconds, 3)}


def structured_output(backend: ChatBackend) -> str | None:
    """How ``backend`` holds a reply to a JSON schema (``json_schema=`` on its ``chat``): ``grammar``,
    ``response_format``, ``structured_outputs``, ...; None when it cannot (the schema is then only asked for
    in the prompt, and the reply only checked)."""
    return getattr(backend, "structured_output", None)


def _chat(backend: ChatBackend, messages: list[dict], usage: Usage, tools: list[dict] | None = None,
          schema: dict | None = None) -> Any:
    kwargs: dict[str, Any] = {"json_schema": schema} if schema is not None else {}
    cap = SCHEMA_REPLY_TOKENS if schema is not None else _reply_tokens(backend)
    started = time.perf_counter()
    reply = backend.chat(messages, tools, temperature=0.0, max_tokens=cap, seed=0, **kwargs)
    usage.add(reply, time.perf_counter() - started)
    return reply


def _parse(reply_text: str, finish: str | None, check) -> tuple[dict | None, str]:
    try:
        return check(_json_object(reply_text)), ""
    except (ValueError, orjson.JSONDecodeError) as exc:
        cut = " (the reply was cut off at the token limit)" if finish == "length" else ""
        return None, f"{exc}{cut}"


def _ask(backend: ChatBackend, messages: list[dict], check, schema: dict, usage: Usage,
         tools: list[dict] | None = None, toolbox: Toolbox | None = None) -> tuple[dict, list[dict]]:
    """One structured reply (tool rounds first, when tools are given); one retry on a malformed reply.

    Under a schema (the backend's ``structured_output``) the JSON comes from a constrained call after the
    tool rounds, unless the last round's own reply already is the JSON asked for."""
    constrained = schema if structured_output(backend) else None
    consulted: list[dict] = []
    pending: tuple[str, str | None] | None = None  # a reply not yet judged: (text, finish reason)
    for _ in range(SPEC_ROUNDS if toolbox else 0):
        reply = _chat(backend, messages, usage, tools)
        if not reply.tool_calls:
            pending = (reply.text or "", reply.finish_reason)
            if constrained is not None and _parse(*pending, check)[0] is None:
                pending = None  # not the JSON: the constrained call below writes it
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
    problem = ""
    for attempt in range(2):
        if pending is None:
            reply = _chat(backend, messages, usage, None, constrained)
            pending = (reply.text or "", reply.finish_reason)
        messages.append({"role": "assistant", "content": pending[0]})
        value, problem = _parse(*pending, check)
        if value is not None:
            return value, consulted
        pending = None
        if attempt == 0:
            messages.append({"role": "user", "content": f"Your reply was not the JSON object asked for ({problem}). "
                                                        "Reply with that JSON object only."})
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


def _section(digest: str, title: str) -> str | None:
    """One section of a :func:`run_digest` (None if it has none of that title)."""
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=\n\n## |\Z)", digest, re.S | re.M)
    return found[1] if found else None


def evaluate(backend: ChatBackend, digest: str, usage: Usage) -> dict:
    messages = [{"role": "system", "content": prompt_text("evaluator")}, {"role": "user", "content": digest}]
    return _ask(backend, messages, _check_critique, CRITIQUE_SCHEMA, usage)[0]


def reflect(backend: ChatBackend, digest: str, critique: dict, usage: Usage, with_specs: bool) -> dict:
    """The run's lessons: ``macro`` (None when it failed the content check), ``micro`` tips, the spec
    look-ups (``consulted``) and what the content check dropped (``rejected``, with reasons)."""
    system = prompt_text("reflector") + ("\n\n" + prompt_text("reflector_specs") if with_specs else "")
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": f"{digest}\n\n## Evaluator critique\n{orjson.dumps(critique).decode()}"}]
    toolbox = Toolbox(SPEC_TOOLS, ToolContext(None)) if with_specs else None
    lessons, consulted = _ask(backend, messages, _check_lessons, lessons_schema(with_specs), usage,
                              [t.openai_schema() for t in SPEC_TOOLS] if with_specs else None, toolbox)
    lessons["rejected"] = screen_lessons(lessons, with_specs, _section(digest, "Task request"))
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
