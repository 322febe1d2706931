"""An external agent program for the `--agent cmd:` test: it reads the prompt of `records.find_patient`
from stdin, answers it through the MCP endpoint in FHIRGYM_MCP_URL, and prints the answer."""

from __future__ import annotations

import json
import os
import re
import sys
from datetime import datetime

import anyio
from mcp import Client


async def main() -> None:
    prompt = sys.stdin.read()
    assert os.environ["FHIRGYM_PROMPT"] == prompt and os.environ["FHIRGYM_NOW"]
    m = re.search(r"Is (\S+) .*?(\S+), born (\w+ \d+, \d{4})", prompt)
    given, family, born = m.group(1), m.group(2), datetime.strptime(m.group(3), "%B %d, %Y").date().isoformat()
    async with Client(os.environ["FHIRGYM_MCP_URL"]) as client:
        result = await client.call_tool("searchResources", {
            "resourceType": "Patient", "params": {"given": given, "family": family, "birthdate": born}})
        found = json.loads(result.content[0].text)["resources"]
    print(f'<answer>{{"patient_id": "{found[0]["id"]}"}}</answer>' if found else '<answer>{"found": false}</answer>')


anyio.run(main)
