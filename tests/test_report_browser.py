"""The report as a person sees it: rendered by headless Chromium over the DevTools protocol.

Asserts no console errors or failed loads, every figure decoded, every transcript link pointing at a
file that exists, and a screenshot that is not blank. Chromium comes from ``scripts/_chromium.sh``;
its absence is a failure, not a skip, so a CI image without it cannot pass silently.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

from fhirgym.analysis import write_report
from fhirgym.analysis._synthetic import write_synthetic_results

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--remote-debugging-port=0"]


class Page:
    """One Chromium page driven over CDP with a synchronous websocket: navigate, evaluate, screenshot."""

    def __init__(self, tmp: Path) -> None:
        from websockets.sync.client import connect

        if not CHROMIUM.exists():
            pytest.fail(f"{CHROMIUM} is missing: install it with `bash scripts/_chromium.sh` "
                        "(scripts/test.sh sources it)", pytrace=False)
        self.profile = tmp / "profile"
        self.log = tmp / "chromium.log"
        with self.log.open("wb") as log:  # a file, not a pipe: an unread pipe could fill up and stall chromium
            self.proc = subprocess.Popen([str(CHROMIUM), *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                         stdout=subprocess.DEVNULL, stderr=log)
        port = self._port()
        deadline = time.monotonic() + 30
        while True:
            try:
                targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5))
                ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
                break
            except (OSError, StopIteration):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self._stack = contextlib.ExitStack()
        self.ws = self._stack.enter_context(connect(ws_url, max_size=None, open_timeout=30))
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        for method in ("Runtime.enable", "Log.enable", "Page.enable"):
            self.call(method)
        self.call("Emulation.setDeviceMetricsOverride", width=1280, height=900, deviceScaleFactor=1, mobile=False)

    def _port(self) -> int:
        """The port chromium chose (``--remote-debugging-port=0``), from the file it writes in its profile."""
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            text = active.read_text() if active.exists() else ""
            if re.match(r"\d+\n", text):
                return int(text.split()[0])
            time.sleep(0.1)
        raise RuntimeError(f"chromium did not start (exit code {self.proc.poll()}): {self.log.read_text()[-2000:]}")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == msg_id:
                assert "error" not in msg, f"{method}: {msg['error']}"
                return msg.get("result", {})
            self.events.append(msg)

    def goto(self, path: Path) -> None:
        self.events.clear()
        self.call("Page.navigate", url=path.resolve().as_uri())
        deadline = time.monotonic() + 60
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            assert time.monotonic() < deadline, "page did not finish loading"
            self.events.append(json.loads(self.ws.recv(timeout=60)))

    def eval(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in res, res["exceptionDetails"]
        return res["result"].get("value")

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors (e.g. a resource that failed to load)."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif e.get("method") == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p["exceptionDetails"])[:500])
            elif e.get("method") == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(f"log: {p['entry']['text']} {p['entry'].get('url', '')}")
        return out

    def screenshot(self, path: Path, max_height: int = 12000) -> Path:
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], max_height), "scale": 1}
        data = self.call("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self._stack.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture()
def page(tmp_path: Path):
    p = Page(tmp_path)
    yield p
    p.close()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report")
    a = write_synthetic_results(root / "a", {"baseline": 0.45, "specs": 0.55, "memory": 0.75}, seeds=2,
                                paraphrases=1, runs=3, error_every=41, drop_transcripts=1)
    return write_report([a], root / "out" / "report.html", n_boot=300)


FIGURE_IDS = ["success", "success_by_category", "success_by_difficulty", "light_success", "pass_k", "paired",
              "variance", "tool_calls", "tool_errors_by_tool", "tool_errors_by_resource", "failure_modes",
              "tokens", "token_cv"]


def _local(href_abs: str) -> Path:
    return Path(unquote(urlparse(href_abs).path))


def test_report_renders_without_errors_with_every_figure_and_working_links(page: Page, report: Path,
                                                                           tmp_path: Path) -> None:
    page.goto(report)
    assert page.console_errors() == []
    figs = page.eval("""Array.from(document.querySelectorAll('figure img')).map(i => ({
        id: i.closest('figure').id, ok: i.complete && i.naturalWidth > 100 && i.naturalHeight > 50,
        w: i.getBoundingClientRect().width}))""")
    assert sorted(f["id"] for f in figs) == sorted(f"fig-{i}" for i in FIGURE_IDS)
    assert all(f["ok"] for f in figs), [f for f in figs if not f["ok"]]
    assert all(f["w"] > 300 for f in figs), "figures rendered too small to read"
    assert page.eval("document.body.innerText.includes('No data for this figure')") is False

    links = page.eval("""Array.from(document.querySelectorAll('a[href^="transcripts/"]')).map(a => a.href)""")
    n_episodes = sum(1 for _ in (report.parent.parent / "a" / "results.jsonl").open())
    assert len(set(links)) == n_episodes
    missing = [h for h in set(links) if not _local(h).is_file()]
    assert missing == []
    anchors = page.eval("Array.from(document.querySelectorAll('nav a')).map(a => a.getAttribute('href'))")
    assert anchors and all(page.eval(f"!!document.getElementById({json.dumps(a[1:])})") for a in anchors)

    shot = page.screenshot(tmp_path / "report.png")
    _assert_non_trivial_png(shot, min_height=3000)


def test_transcript_page_renders_and_links_back(page: Page, report: Path, tmp_path: Path) -> None:
    page.goto(report)
    first = page.eval("""document.querySelector('a.ep.fail[href^="transcripts/"]').href""")
    page.goto(_local(first))
    assert page.console_errors() == []
    text = page.eval("document.body.innerText")
    for heading in ("Verdict", "Prompt", "Tool calls", "Store diff"):
        assert heading in text
    assert page.eval("document.querySelectorAll('.call').length") >= 1
    _assert_non_trivial_png(page.screenshot(tmp_path / "transcript.png"), min_height=500)
    back = page.eval("document.querySelector('a[href^=\"../\"]').href")
    assert _local(back) == report.resolve()
    anchor = urlparse(back).fragment
    page.goto(report)
    assert page.eval(f"!!document.getElementById({json.dumps(anchor)})")


def _assert_non_trivial_png(path: Path, min_height: int) -> None:
    import matplotlib.image

    img = matplotlib.image.imread(str(path))
    assert path.stat().st_size > 20_000
    assert img.shape[0] >= min_height and img.shape[1] >= 1000
    # not a blank page: many distinct shades (text, bars, heatmap colours)
    flat = (img[..., :3] * 255).astype(int).reshape(-1, 3)[::97]
    assert len({tuple(px) for px in flat}) > 50
