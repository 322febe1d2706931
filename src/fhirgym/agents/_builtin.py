"""Built-in agents that need no model: ``reference`` (runs the task's reference solution through the
same tools) and ``null`` (does nothing, answers nothing). Together they prove the validators: the
first must always pass, the second always fail. ``cmd:`` runs an external agent program.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time

from ._agent import AgentResult, AgentTask, clock_block


class ReferenceAgent:
    name = "reference"

    def run(self, task: AgentTask) -> AgentResult:
        if task.reference is None:
            return AgentResult(None, "error", error="the reference agent needs a task with a reference solution")
        text = task.reference(task.tools)
        return AgentResult(text, "answered", iterations=len(task.tools.calls),
                           messages=[{"role": "user", "content": task.prompt}, {"role": "assistant", "content": text}])


class NullAgent:
    name = "null"

    def run(self, task: AgentTask) -> AgentResult:
        return AgentResult(None, "gave_up", messages=[{"role": "user", "content": task.prompt}])


class CommandAgent:
    """An external agent program: ``--agent cmd:"python my_agent.py"``.

    The program gets the task prompt on stdin and in ``FHIRGYM_PROMPT``, the frozen clock in
    ``FHIRGYM_NOW`` (ISO 8601) and ``FHIRGYM_CLOCK`` (the clock block), and the streamable-HTTP MCP endpoint
    of its episode's isolated FHIR server in ``FHIRGYM_MCP_URL``. Its stdout is the final answer; a
    non-zero exit or a timeout is the agent's failure (stop reason ``error``), not an infrastructure one.
    """

    def __init__(self, command: str, timeout: float = 600.0) -> None:
        self.command = command
        self.name = f"cmd:{command}"
        self.timeout = timeout

    def run(self, task: AgentTask) -> AgentResult:
        if task.mcp_url is None:
            return AgentResult(None, "error", error="no MCP endpoint available for an external agent")
        env = {**os.environ, "FHIRGYM_PROMPT": task.prompt, "FHIRGYM_NOW": task.now.isoformat(),
               "FHIRGYM_CLOCK": clock_block(task.now), "FHIRGYM_MCP_URL": task.mcp_url()}
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
        stop = "answered" if proc.returncode == 0 and out else "error" if proc.returncode else "gave_up"
        tool_s = sum(c.ms for c in task.tools.calls) / 1000  # the program's own time excludes our tools
        return AgentResult(out, stop, iterations=len(task.tools.calls), messages=messages,
                           model_s=max(0.0, time.perf_counter() - t0 - tool_s))
