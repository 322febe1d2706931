"""The memory tools over MCP (`fhirgym mcp memory`, stdio and HTTP) and the memory CLI commands."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import orjson
import pytest
from mcp import Client, StdioServerParameters

from fhirgym.memory import Lesson, MemoryStore
from fhirgym.tools import MEMORY_TOOLS


@pytest.fixture(scope="module")
def memdir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mem")
    store = MemoryStore(path)
    store.add(Lesson("macro", "To book an appointment, search free Slots of the schedule first, then create the "
                              "Appointment and mark the Slot busy."))
    store.add(Lesson("macro", "For lab values, search Observation by patient and LOINC code, newest first."))
    store.add(Lesson("micro", "Search Slot with schedule and status=free.", "Slot", "search",
                     provenance=[{"family": "scheduling.book_first_free_slot"}]))
    store.freeze()
    return path


def _cli() -> list[str]:
    script = shutil.which("fhirgym", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "fhirgym.cli"]


async def _exercise(client: Client) -> dict:
    names = [t.name for t in (await client.list_tools()).tools]
    found = await client.call_tool("searchMemory", {"query": "book a free slot for a patient", "k": 1})
    tips = await client.call_tool("getMemoryTips", {"resourceType": "Slot", "operation": "search"})
    stats = await client.call_tool("getMemoryStats", {})
    bad = await client.call_tool("getMemoryTips", {"resourceType": "Slot", "operation": "patch"})
    assert bad.is_error
    return {"names": names, "found": orjson.loads(found.content[0].text),
            "tips": orjson.loads(tips.content[0].text), "stats": orjson.loads(stats.content[0].text)}


def _check(out: dict, memdir: Path) -> None:
    assert out["names"] == [t.name for t in MEMORY_TOOLS]
    assert "book an appointment" in out["found"]["lessons"][0]["text"]
    assert out["tips"]["tips"][0]["text"].startswith("Search Slot")
    meta = orjson.loads((memdir / "memory.json").read_bytes())
    assert out["stats"]["hash"] == meta["hash"] and out["stats"]["macro"] == 2


def test_memory_over_stdio(memdir):
    cmd = _cli()
    params = StdioServerParameters(command=cmd[0], args=[*cmd[1:], "mcp", "memory", "--memory", str(memdir)],
                                   env=dict(os.environ))

    async def main() -> dict:
        async with Client(params) as client:
            return await _exercise(client)

    _check(anyio.run(main), memdir)


def test_memory_over_http(memdir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([*_cli(), "mcp", "memory", "--memory", str(memdir), "--transport", "http",
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(120)
        url = line[0].strip() if line else ""
        assert url == f"http://127.0.0.1:{port}/mcp", (url, proc.poll())

        async def main() -> dict:
            async with Client(url) as client:
                return await _exercise(client)

        _check(anyio.run(main), memdir)
    finally:
        proc.terminate()
        proc.wait(10)


def test_memory_show_and_refusals(memdir, tmp_path):
    out = subprocess.run([*_cli(), "memory", "show", str(memdir)], capture_output=True, text=True, check=True).stdout
    assert "macro 2, micro 1" in out and "Slot" in out and "book an appointment" in out
    unfrozen = tmp_path / "unfrozen"
    MemoryStore(unfrozen).add(Lesson("macro", "Search first."))
    bad = subprocess.run([*_cli(), "mcp", "memory", "--memory", str(unfrozen)], capture_output=True, text=True)
    assert bad.returncode != 0 and "not frozen" in bad.stderr
    bad = subprocess.run([*_cli(), "memory", "show", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode != 0 and "not a memory directory" in bad.stderr
