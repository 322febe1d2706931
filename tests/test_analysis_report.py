"""The report files: HTML (self-contained, escaped, linked transcripts), Markdown, JSON and the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from fhirgym.analysis import ResultsError, compute_metrics, load_results, load_transcript, write_report
from fhirgym.analysis._report import page_name
from fhirgym.analysis._synthetic import write_synthetic_results
from fhirgym.cli import main

FIGURES = ["success", "success_by_category", "success_by_difficulty", "light_success", "pass_k", "paired",
           "variance", "tool_calls", "tool_errors_by_tool", "tool_errors_by_resource", "failure_modes", "tokens",
           "token_cv"]
N_BOOT = 200


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = write_synthetic_results(tmp_path_factory.mktemp("res") / "run", {"baseline": 0.4, "memory": 0.8},
                                seeds=2, paraphrases=1, runs=2, error_every=13, drop_transcripts=2)
    # a hostile episode: markup in every free-text field must come out escaped
    lines = (d / "results.jsonl").read_text().splitlines()
    evil = json.loads(lines[-1])
    evil.update(episode_id="baseline/<script>alert(1)</script>/s9/p0/r0", task_id="records.<img src=x onerror=alert(2)>",
                final_answer="<script>alert(3)</script>", reasons=["<iframe>"], transcript="transcripts/none.json",
                seed=9)
    lines.append(json.dumps(evil))
    (d / "results.jsonl").write_text("\n".join(lines) + "\n" + '{"episode_id": "torn', encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def html_report(results_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report([results_dir], tmp_path_factory.mktemp("out") / "report.html", n_boot=N_BOOT)


def test_load_results_skips_torn_line_and_tolerates_missing_transcripts(results_dir: Path) -> None:
    rs = load_results([results_dir])
    assert len(rs) == 8 * 2 * 2 * 2 + 1                 # tasks × configs × seeds × runs + the hostile one
    assert all(r["_dir"] == str(results_dir) for r in rs)
    assert load_transcript(rs[0]) is None               # dropped by the fixture
    assert load_transcript(rs[5])["verdict"]["reasons"] == rs[5]["reasons"]
    with pytest.raises(ResultsError):
        load_results([results_dir / "nowhere"])


def test_html_is_self_contained_with_every_figure(html_report: Path) -> None:
    html = html_report.read_text()
    for fig in FIGURES:
        assert re.search(rf'<figure id="fig-{fig}"><img src="data:image/svg\+xml;base64,[A-Za-z0-9+/=]{{1000,}}"', html), fig
    # nothing fetched from elsewhere: every src is a data URI, every href local
    assert all(src.startswith("data:") for src in re.findall(r'\ssrc="([^"]*)"', html))
    assert not [h for h in re.findall(r'href="([^"]*)"', html) if re.match(r"[a-z]+://", h)]
    assert "No data for this figure" not in html


def test_html_links_every_episode_to_an_existing_transcript_page(html_report: Path, results_dir: Path) -> None:
    html = html_report.read_text()
    links = set(re.findall(r'href="(transcripts/[^"]+)"', html))
    assert len(links) == len(load_results([results_dir]))
    assert all((html_report.parent / link.replace("&amp;", "&")).is_file() for link in links)
    # page names are filesystem-safe and distinct per directory
    name = page_name("/a", "cfg/task.x/s0/p0/r0")
    assert re.fullmatch(r"cfg_task\.x_s0_p0_r0-[0-9a-f]{8}\.html", name) and name != page_name("/b", "cfg/task.x/s0/p0/r0")


def test_html_escapes_agent_and_task_text(html_report: Path) -> None:
    html = html_report.read_text()
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "records.&lt;img src=x onerror=alert(2)&gt;" in html
    pages = list((html_report.parent / "transcripts").glob("baseline_script_alert*.html"))
    assert len(pages) == 1
    page = pages[0].read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(3)&lt;/script&gt;" in page and "&lt;iframe&gt;" in page
    assert "Transcript file not found" in page


def test_transcript_page_shows_prompt_calls_diff_and_verdict(html_report: Path, results_dir: Path) -> None:
    r = next(r for r in load_results([results_dir]) if r["writes"] and r["status"] == "fail"
             and load_transcript(r) is not None)
    t = load_transcript(r)
    page = (html_report.parent / "transcripts" / page_name(r["_dir"], r["episode_id"])).read_text()
    assert t["prompt"].replace("<", "&lt;").replace(">", "&gt;") in page
    assert page.count('class="call') == len(t["tool_calls"])
    assert "&#34;resourceType&#34;: &#34;Bundle&#34;" in page or '"resourceType": "Bundle"' in page  # an output
    assert '<span class="del">-  &#34;status&#34;: &#34;free&#34;,</span>' in page           # the update's diff
    assert '<span class="add">+  &#34;status&#34;: &#34;busy&#34;,</span>' in page
    for reason in r["reasons"]:
        assert reason in page
    assert f'href="../report.html#task-{r["task_id"].replace(".", "-")}"' in page
    assert f'id="task-{r["task_id"].replace(".", "-")}"' in html_report.read_text()


def test_html_shows_numbers_and_significance(html_report: Path, results_dir: Path) -> None:
    m = compute_metrics(load_results([results_dir]), n_boot=N_BOOT)
    html = html_report.read_text()
    for row in m["success"]:
        assert f"<b>{row['mean']:.1f} ± {row['sd']:.1f}</b>" in html
    [cmp] = m["paired"]
    assert ("badge sig\">significant" if cmp["significant"] else "badge nsig\">not significant") in html
    assert f"{cmp['diff']:+.1f}" in html
    assert html.count('class="l">model server timed out') == m["meta"]["n_errors"]


def test_markdown_and_json_carry_the_same_numbers(results_dir: Path, tmp_path: Path) -> None:
    m = compute_metrics(load_results([results_dir]), n_boot=N_BOOT)
    md = write_report([results_dir], tmp_path / "r.md", "md", n_boot=N_BOOT).read_text()
    js = json.loads(write_report([results_dir], tmp_path / "r.json", "json", n_boot=N_BOOT).read_text())
    for heading in ("## Success rate", "## pass@k and pass^k", "## Paired comparisons", "## Variance decomposition",
                    "## Tool error rate by tool", "## Failure modes", "## Coefficient of variation of tokens",
                    "## Per-task success"):
        assert heading in md
    for row in m["success"]:
        assert f"| {row['mean']:.1f} ± {row['sd']:.1f} |" in md
    assert "<img src=x" not in md and "records.&lt;img src=x onerror=alert(2)&gt;" in md  # inline HTML escaped
    assert js["success"][0]["mean"] == pytest.approx(m["success"][0]["mean"], abs=1e-6)
    assert js["variance"][1]["share"] == pytest.approx(m["variance"][1]["share"], abs=1e-6)
    assert js["paired"][0]["p_value"] == pytest.approx(m["paired"][0]["p_value"], abs=1e-6)
    assert js["sources"][0]["agent"] == "react"
    assert not (tmp_path / "transcripts").exists()


def test_cli_report(results_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["report", str(results_dir), "--out", str(tmp_path / "x.md"), "--format", "md",
                               "--bootstrap", "100"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "x.md").read_text().startswith("# fhirgym report")
    res = runner.invoke(main, ["report", str(results_dir), "--out", str(tmp_path), "--format", "json",
                               "--bootstrap", "100"])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == str(tmp_path / "report.json")
    assert json.loads((tmp_path / "report.json").read_text())["meta"]["n_tasks"] == 9
    empty = tmp_path / "empty"
    empty.mkdir()
    res = runner.invoke(main, ["report", str(empty)])
    assert res.exit_code != 0 and "no results.jsonl" in res.output


def test_report_of_two_dirs_and_two_settings(tmp_path: Path) -> None:
    a = write_synthetic_results(tmp_path / "a", {"baseline": 0.5}, seeds=1, paraphrases=1, runs=2, setting="s1")
    b = write_synthetic_results(tmp_path / "b", {"baseline": 0.5, "memory": 0.9}, seeds=1, paraphrases=1,
                                runs=2, setting="s2", seed=1)
    out = write_report([a, b], tmp_path / "out", n_boot=N_BOOT)
    assert out == tmp_path / "out" / "report.html"
    html = out.read_text()
    assert "baseline · s1" in html and "memory · s2" in html
    links = set(re.findall(r'href="(transcripts/[^"]+)"', html))
    assert len(links) == 8 * 2 + 8 * 2 * 2   # same episode ids in both dirs still get distinct pages
    m = compute_metrics(load_results([a, b]), n_boot=N_BOOT)
    assert [(c["a"], c["b"]) for c in m["paired"]] == [("baseline · s2", "memory · s2")]


def test_report_of_an_empty_results_file(tmp_path: Path) -> None:
    (tmp_path / "results.jsonl").write_text("")
    html = write_report([tmp_path], tmp_path / "report.html").read_text()
    assert "0 episodes" in html and html.count("No data for this figure") == len(FIGURES)
    assert "Fewer than two configs in any setting: nothing to compare." in html
