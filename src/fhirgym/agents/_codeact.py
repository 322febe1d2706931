"""The CodeAct agent: the model acts by writing Python, run in the episode's sandbox through the ``python`` tool.

Each turn the model writes ```` ```python ```` blocks (each runs as one ``python`` call; its stdout, the
value of ``answer`` and any error come back as a user message), calls tools (``fhir_query``, ``fhir_get``,
``finish``, ... as with ReAct), or replies with neither, which is its final answer; a ``finish`` call ends
the episode too. Writes go through the FHIR functions the sandbox offers (``create_resource`` ...), which
the host runs as checked tool calls of the episode (docs/CODEACT.md). Needs a configuration that grants
``python`` (``--config codeact``); without one, code blocks are answered with an error observation.
"""

from __future__ import annotations

import re

import orjson

from ..fhir import json_default_str
from ._agent import AgentResult, AgentTask
from ._backend import ChatBackend
from ._react import OBSERVATION, ReactAgent, _answer, call_tool

#: A fenced Python block in a model's reply (also how text episodes read code: ``rl/_text.py``).
CODE_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.S)
#: The CodeAct turn cap: FHIR-AgentBench's multi-turn agents allow 30; 12 fits a small model's context.
DEFAULT_TURNS = 12

CODEACT_SYSTEM_PROMPT = """You are a careful health-IT assistant working on an HL7 FHIR R4 server by writing Python code.
Each turn, write one ```python code block (or call a tool); you will see what it printed, the value of its
variable `answer` and any error. When you are done, reply without code, in the answer format the request
asks for (or call finish with it).
- The code runs in a sandbox: standard library only, no network, limits on time and memory. Variables do
  not persist between blocks (files you write in the current directory do).
- `retrieved_resources` is a dict: resource type -> list of FHIR resources (dicts) that the tools
  fhir_query(resource_type, patient_id) and fhir_get(query) fetched into your workspace.
- These functions call the FHIR server from your code: search(resource_type, params) -> list of resources
  (params: dict of FHIR search parameters, e.g. {"family": "Diaz", "birthdate": "1980-02-01"}; every page),
  read_resource(resource_type, resource_id), create_resource(resource_type, body),
  update_resource(resource_type, resource_id, body) (the complete new version: read it first),
  delete_resource(resource_type, resource_id). A failed call raises FhirError with the server's message.
- Never invent ids, codes or values; change only what the request asks for."""

NUDGE = "Start by writing code (or calling a tool) to look up what you need."


class CodeActAgent(ReactAgent):
    """CodeAct loop over any :class:`ChatBackend`; ``max_iterations`` model turns at most (default 12)."""

    nudge = NUDGE

    def __init__(self, backend: ChatBackend, max_iterations: int = DEFAULT_TURNS, temperature: float = 0.0,
                 max_tokens: int = 1024, system_prompt: str = CODEACT_SYSTEM_PROMPT, seed: int | None = 0) -> None:
        super().__init__(backend, max_iterations, temperature, max_tokens, system_prompt, seed)
        self.name = "codeact"

    def _turn(self, task: AgentTask, reply, messages: list[dict], result: AgentResult) -> bool:
        """Tool calls first (``finish`` ends the episode), then each code block as one ``python`` call."""
        call_msgs = self._record(reply, result, messages)
        blocks = [b for b in CODE_BLOCK.findall(reply.text or "") if b.strip()]
        if not reply.tool_calls and not blocks:
            _answer(reply.text, result)
            return True
        if self._call_tools(task, reply, call_msgs, messages, result):
            return True
        for code in blocks:
            done = call_tool(task, "python", {"code": code})
            messages.append({"role": "user", "content": OBSERVATION + orjson.dumps(done.output, default=json_default_str).decode()})
        return False
