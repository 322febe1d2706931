"""Built-in agents that need no model.

``reference`` runs the task's reference solution (the runner hands it the solver; the task never
carries it), ``null`` does nothing, and the blind floors a score must be read against:
``nothing-found`` (the structured "nothing found" answer, no tool call) and ``guess`` (one broad search,
its first hit as the answer). ``cmd:`` runs an external agent program over MCP.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time

import orjson

from ..spec import load_spec
from ..tasks import NOT_FOUND, answer_text
from ._agent import AgentResult, AgentTask, clock_block


def _said(task: AgentTask, text: str | None, stop: str = "answered") -> AgentResult:
    messages = [{"role": "user", "content": task.prompt}]
    if text is not None:
        messages.append({"role": "assistant", "content": text})
    return AgentResult(text, stop, iterations=len(task.tools.calls), messages=messages)


class ReferenceAgent:
    """The family's reference solution. Only the runner can run it: it passes the solver itself."""

    name = "reference"

    def run(self, task: AgentTask) -> AgentResult:
        raise RuntimeError("the reference agent is run by fhirgym's runner (--agent reference), which holds "
                           "the solver; a task carries no solution")


class NullAgent:
    name = "null"

    def run(self, task: AgentTask) -> AgentResult:
        return _said(task, None, "gave_up")


class NothingFoundAgent:
    """The constant floor: ``<answer>{"found": false}</answer>`` without looking anything up."""

    name = "nothing-found"

    def run(self, task: AgentTask) -> AgentResult:
        return _said(task, answer_text(NOT_FOUND))


_EXAMPLE = re.compile(r"<answer>(\{.*?\})</answer>", re.S)


class GuessAgent:
    """The one-search floor: search the resource type the request names, answer with the first hit.

    The type is the first R4 resource type named in the answer format's field names, else in the
    request; every id field gets that hit, a count gets the search's total, other fields the hit's
    first value of a matching kind.
    """

    name = "guess"

    def run(self, task: AgentTask) -> AgentResult:
        rtype = _named_type(task.prompt)
        call = task.tools.call("searchResources", {"resourceType": rtype, "params": {"_count": "1"}})
        hits = call.output.get("resources") if isinstance(call.output, dict) else None
        if not hits:
            return _said(task, answer_text(NOT_FOUND))
        hit = hits[0]
        example = _EXAMPLE.findall(task.prompt)
        fields = orjson.loads(example[-1]) if example else {"id": "<id>"}
        answer = {name: _fill(placeholder, hit, call.output.get("total")) for name, placeholder in fields.items()}
        return _said(task, "<answer>" + orjson.dumps(answer).decode() + "</answer>")


def _named_type(prompt: str) -> str:
    types = load_spec().resource_types
    example = _EXAMPLE.findall(prompt)
    for text in ([example[-1]] if example else []) + [prompt]:
        words = re.findall(r"[A-Za-z]+", text)
        for word in words:
            for rtype in types:
                if word.lower() == rtype.lower() or word.lower().startswith(rtype.lower()):
                    return rtype
    return "Patient"


def _fill(placeholder, hit: dict, total) -> object:
    if placeholder == "<id>":
        return f"{hit['resourceType']}/{hit['id']}"
    if isinstance(placeholder, list):
        return [f"{hit['resourceType']}/{hit['id']}"]
    if isinstance(placeholder, bool):
        return True
    if isinstance(placeholder, int | float):
        return total if isinstance(total, int) else 1
    text = orjson.dumps(hit).decode()
    if "YYYY" in str(placeholder):
        found = re.search(r"\d{4}-\d{2}-\d{2}(T[0-9:.]+(Z|[+-]\d{2}:\d{2})?)?", text)
        return found.group(0) if found else None
    found = re.search(r'"(?:display|text|name|family)":"([^"]+)"', text)
    return found.group(1) if found else hit["id"]


#: What an external agent program inherits: its own runtime needs, never fhirgym's settings (a world path).
_ENV_KEEP = re.compile(r"^(PATH|HOME|USER|LOGNAME|LANG|LC_\w+|TZ|TMPDIR|TERM|PYTHON\w*|VIRTUAL_ENV|"
                       r"OPENAI_\w+|ANTHROPIC_\w+|HF_\w+|SSL_CERT_\w+|REQUESTS_CA_BUNDLE|[A-Z_]*PROXY)$", re.I)


class CommandAgent:
    """An external agent program: ``--agent cmd:"python my_agent.py"``.

    The program gets the task prompt on stdin and in ``FHIRGYM_PROMPT``, the frozen clock in
    ``FHIRGYM_NOW`` (ISO 8601) and ``FHIRGYM_CLOCK`` (the clock block), the configuration's system-prompt
    additions in ``FHIRGYM_INSTRUCTIONS``, and the streamable-HTTP MCP endpoint of its episode in
    ``FHIRGYM_MCP_URL``. Of the rest of the environment it keeps only runtime and model-provider
    variables (PATH, HOME, locale, PYTHON*, OPENAI_*, proxies, …): no ``FHIRGYM_*`` setting of ours.
    Its stdout is the final answer; a non-zero exit or a timeout is the agent's failure, not an
    infrastructure one.
    """

    def __init__(self, command: str, timeout: float = 600.0) -> None:
        self.command = command
        self.name = f"cmd:{command}"
        self.timeout = timeout

    def environment(self, task: AgentTask) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if _ENV_KEEP.match(k)}
        env.update(FHIRGYM_PROMPT=task.prompt, FHIRGYM_NOW=task.now.isoformat(), FHIRGYM_CLOCK=clock_block(task.now),
                   FHIRGYM_INSTRUCTIONS=task.instructions, FHIRGYM_MCP_URL=task.tools.mcp_url())
        return env

    def run(self, task: AgentTask) -> AgentResult:
        env = self.environment(task)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(shlex.split(self.command), input=task.prompt, capture_output=True, text=True,
                                  env=env, timeout=self.timeout)
        except FileNotFoundError as exc:
            return AgentResult(None, "error", error=f"cannot start {self.command!r}: {exc}")
        except subprocess.TimeoutExpired:
            return AgentResult(None, "max_iterations", model_s=time.perf_counter() - t0)
        messages = [{"role": "user", "content": task.prompt}, {"role": "assistant", "content": proc.stdout}]
        if proc.stderr:
            messages.append({"role": "stderr", "content": proc.stderr[-4000:]})
        out = proc.stdout.strip() or None
        stop = "answered" if proc.returncode == 0 and out else "crashed" if proc.returncode else "gave_up"
        calls = task.tools.calls
        tool_s = sum(c.ms for c in calls) / 1000  # the program's own time excludes our tools
        return AgentResult(out, stop, iterations=len(calls), messages=messages,
                           model_s=max(0.0, time.perf_counter() - t0 - tool_s),
                           crash=f"exit status {proc.returncode}" if proc.returncode else None)
