"""Agents for tests/test_ray.py, importable by Ray's worker processes (the tests put this folder on their
path): a scripted model that solves records.find_patient, optionally slowly, optionally killing its
worker process once (the file ``die_once`` says it did)."""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import datetime
from pathlib import Path

import orjson

from fhirgym.agents import ReactAgent, ScriptedBackend

_finished = 0  # episodes this process has run


class PatientFinder:
    name = "scripted-finder"

    def __init__(self, think: float = 0.0, die_once: str | None = None) -> None:
        self.think = think
        self.die_once = die_once

    def run(self, task):
        global _finished
        if self.die_once and _finished >= 1 and not Path(self.die_once).exists():
            Path(self.die_once).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies with this and its other episodes in flight
        name, born = re.search(r"Is (.+?), born (\w+ \d+, \d{4})", task.prompt).groups()
        birth = datetime.strptime(born, "%B %d, %Y").date().isoformat()
        call = {"name": "searchResources", "arguments": {"resourceType": "Patient", "params": {
            "given": name.split()[0], "family": name.split()[-1], "birthdate": birth}}}

        def first(messages):
            time.sleep(self.think)
            return f"<tool_call>{orjson.dumps(call).decode()}</tool_call>"

        def answer(messages):
            found = re.search(r'"id":"([^"]+)"', messages[-1]["content"])
            return f'<answer>{{"patient_id": "{found.group(1) if found else "none"}"}}</answer>'

        result = ReactAgent(ScriptedBackend([first, answer])).run(task)
        _finished += 1
        return result
