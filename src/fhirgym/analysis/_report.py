"""Rendering the metrics: one self-contained report.html (+ one page per episode), Markdown or JSON.

HTML goes through jinja2 with autoescaping on, so agent output, prompts and FHIR payloads can never
inject markup. jinja2 is present through llama-cpp-python (a declared dependency).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import jinja2

from ._load import SOURCE_KEY, load_results, load_run_info, load_transcript
from ._metrics import compute_metrics

FORMATS = {"html": "html", "md": "md", "json": "json"}
TRANSCRIPT_DIR = "transcripts"
MAX_OUTPUT_CHARS = 20_000


# ------------------------------------------------------------------ formatting helpers


def _num(x: Any, digits: int = 1) -> str:
    if x is None or isinstance(x, jinja2.Undefined) or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    return f"{x:,.{digits}f}"


def _pm(mean: float | None, sd: float | None, digits: int = 1) -> str:
    if mean is None or isinstance(mean, jinja2.Undefined):
        return "–"
    return _num(mean, digits) + (f" ± {_num(sd, digits)}" if sd is not None and sd == sd else "")


def _p(p: float | None) -> str:
    if p is None:
        return "–"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def _share(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f} %"


def _json(x: Any) -> str:
    return json.dumps(x, indent=2, ensure_ascii=False, default=str)


def page_name(directory: str | None, episode_id: str) -> str:
    """File name of an episode's page: readable, filesystem-safe, unique per (directory, episode)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", episode_id).strip("._")[:120] or "episode"
    key = f"{Path(directory).resolve() if directory else ''}\0{episode_id}"
    return f"{safe}-{hashlib.sha1(key.encode()).hexdigest()[:8]}.html"


def _anchor(task_id: str) -> str:
    return "task-" + re.sub(r"[^A-Za-z0-9_-]+", "-", task_id)


def _env() -> jinja2.Environment:
    # Lenient undefined: result files come from other programs and may lack optional fields.
    env = jinja2.Environment(autoescape=True, undefined=jinja2.ChainableUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters.update(num=_num, p=_p, share=_share, json=_json)
    env.globals.update(pm=_pm, anchor=_anchor)
    return env


# ------------------------------------------------------------------ templates

CSS = """
:root { --fg:#1d232a; --muted:#5b6570; --line:#d8dde3; --pass:#2e7d32; --fail:#c62828; --err:#8d6e00; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; color: var(--fg);
       margin: 0 auto; padding: 1.2rem 1.5rem 4rem; max-width: 1200px; }
h1 { font-size: 1.6rem; margin: 0 0 .3rem; } h2 { font-size: 1.25rem; margin: 2.2rem 0 .5rem;
  border-bottom: 2px solid var(--line); padding-bottom: .2rem; } h3 { font-size: 1.05rem; margin: 1.3rem 0 .4rem; }
p.note, .muted { color: var(--muted); font-size: .92em; }
nav ol { columns: 3; font-size: .95em; padding-left: 1.2rem; }
table { border-collapse: collapse; margin: .4rem 0 1rem; font-size: .9em; }
th, td { border-bottom: 1px solid var(--line); padding: .25rem .55rem; text-align: right; vertical-align: top; }
th { background: #f4f6f8; position: sticky; top: 0; } td.l, th.l { text-align: left; } td.nw { white-space: nowrap; }
.scroll { overflow-x: auto; max-width: 100%; }
figure { margin: .6rem 0 1.4rem; } figure img { max-width: 100%; height: auto; display: block; }
figcaption { color: var(--muted); font-size: .9em; margin-top: .2rem; }
.badge { display: inline-block; padding: 0 .45rem; border-radius: .6rem; font-size: .85em; font-weight: 600; }
.sig { background: #fde2e1; color: #a11; } .nsig { background: #e8edf2; color: #445; }
.pass { color: var(--pass); } .fail { color: var(--fail); } .error { color: var(--err); }
a.ep { display: inline-block; min-width: 1.25em; text-align: center; text-decoration: none; border-radius: 3px;
       margin: 1px; font-weight: 700; font-size: .85em; }
a.ep.pass { background: #e3f2e4; } a.ep.fail { background: #fbe4e4; } a.ep.error { background: #fbf1cf; }
a.ep:hover { outline: 1px solid #333; } .vsep { display: inline-block; width: .45em; }
pre { background: #f6f8fa; border: 1px solid var(--line); padding: .5rem .7rem; overflow-x: auto;
      white-space: pre-wrap; word-break: break-word; font-size: .85em; max-height: 32rem; overflow-y: auto; }
.call { border: 1px solid var(--line); border-radius: 6px; padding: .4rem .8rem; margin: .6rem 0; }
.call h3 { margin: .2rem 0; } .call.err { border-left: 4px solid var(--fail); }
.diff .add { color: #116329; background: #dafbe1; } .diff .del { color: #82071e; background: #ffebe9; }
.diff .hunk { color: #6f42c1; } dl.kv { display: grid; grid-template-columns: max-content 1fr; gap: .1rem 1rem; }
dl.kv dt { color: var(--muted); } dl.kv dd { margin: 0; }
"""

REPORT = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>fhirgym report</title>
<style>{{ css }}</style>
</head>
<body>
<h1>fhirgym report</h1>
<p class="note">{{ meta.n_results | num }} episodes ({{ meta.n_scored | num }} scored,
{{ meta.n_errors | num }} infrastructure errors, excluded from success metrics) over {{ meta.n_tasks }} tasks and
{{ meta.groups | length }} config(s). Generated {{ generated }} by fhirgym {{ fhirgym_version }} from:</p>
<ul class="muted">
{% for s in sources %}<li><code>{{ s.dir }}</code>{% if s.agent %} — agent {{ s.agent }}{% endif %}{% if s.model %},
 model {{ s.model }}{% endif %}</li>
{% endfor %}
</ul>
<nav><ol>
{% for id, title in toc %}<li><a href="#{{ id }}">{{ title }}</a></li>
{% endfor %}
</ol></nav>

{% macro fig(id, alt) %}
{% if figures[id] %}<figure id="fig-{{ id }}"><img src="{{ figures[id] }}" alt="{{ alt }}"></figure>
{% else %}<p class="note">No data for this figure.</p>{% endif %}
{% endmacro %}

<h2 id="success">Success rate</h2>
<p class="note">Strict validator; mean ± sample sd (n − 1) of the per-run success rates; pooled = all scored
episodes together. Errors are infrastructure failures, shown but not counted as failures. The
nothing-found floor is what the constant "nothing found" reply, with no tool call, scores on the same
scored instances (computed from the gold, no model run): 0, since a "nothing found" passes only after a
look at the record. The guess floor is what the one-search <code>guess</code> agent scores on them: a score
means something only above both.</p>
<div class="scroll"><table>
<tr><th class="l">config</th><th class="l">setting</th><th>episodes</th><th>errors</th><th>scored</th><th>runs</th>
<th>success % (mean ± sd)</th><th>pooled %</th><th>nothing-found floor %</th><th>guess floor %</th><th class="l">per run %</th></tr>
{% for r in m.success %}<tr><td class="l">{{ r.config }}</td><td class="l">{{ r.setting }}</td><td>{{ r.n_episodes | num }}</td>
<td>{{ r.n_errors | num }}</td><td>{{ r.n | num }}</td><td>{{ r.runs }}</td><td><b>{{ pm(r.mean, r.sd) }}</b></td>
<td>{{ r.pooled | num }}</td><td>{{ r.floor | num }}</td><td>{{ r.floor_guess | num }}</td><td class="l">{% for p in r.per_run %}r{{ p.run }}: {{ p.rate | num }} (n={{ p.n }}){{ ", " if not loop.last }}{% endfor %}</td></tr>
{% endfor %}
</table></div>
{{ fig("success", "bar chart of success rate per config") }}

<h3 id="by-category">By category</h3>
<p class="note">Success % (mean ± sd over runs), scored episodes, infrastructure errors and the
nothing-found and guess floors per config.</p>
{{ wide_table(wide.category, "category") }}
{{ fig("success_by_category", "grouped bar chart of success rate by category and config") }}
<h3 id="by-difficulty">By difficulty</h3>
{{ wide_table(wide.difficulty, "difficulty") }}
{{ fig("success_by_difficulty", "grouped bar chart of success rate by difficulty and config") }}

<h2 id="light">Writing tasks: light validator</h2>
<p class="note">Scored episodes of tasks that expect a state change and have a light verdict. The light
validator accepts the essential change without the strict validator's every field.</p>
<table><tr><th class="l">config</th><th>episodes</th><th>errors</th><th>strict %</th><th>light %</th></tr>
{% for r in m.light_success %}<tr><td class="l">{{ r.label }}</td><td>{{ r.n | num }}</td><td>{{ r.n_errors | num }}</td>
<td>{{ pm(r.strict_mean, r.strict_sd) }}</td><td>{{ pm(r.light_mean, r.light_sd) }}</td></tr>
{% endfor %}</table>
{{ fig("light_success", "bar chart of strict vs light validator success on writing tasks") }}

<h2 id="passk">Reliability: pass@k and pass^k</h2>
<p class="note">Per task variation with n scored runs of which c succeeded: pass@k = 1 − C(n−c,k)/C(n,k),
pass^k = C(c,k)/C(n,k); averaged over variations with n ≥ k.</p>
<div class="scroll"><table><tr><th class="l" rowspan="2">config</th><th rowspan="2">variations</th>
{% for k in wide.passk.ks %}<th colspan="2">k = {{ k }}</th>{% endfor %}</tr>
<tr>{% for k in wide.passk.ks %}<th>pass@k %</th><th>pass^k %</th>{% endfor %}</tr>
{% for label, n, cells in wide.passk.rows %}<tr><td class="l">{{ label }}</td><td>{{ n }}</td>
{% for c in cells %}{% if c %}<td>{{ c.pass_at_k | num }}</td><td>{{ c.pass_hat_k | num }}</td>{% else %}<td>–</td><td>–</td>{% endif %}{% endfor %}</tr>
{% endfor %}</table></div>
<p class="note">variations = task variations with at least one scored run (k = 1); fewer may have k runs.</p>
{{ fig("pass_k", "line chart of pass@k and pass^k against k per config") }}

<h2 id="paired">Paired comparisons</h2>
<p class="note">Configs of the same setting compared on the task variations both ran. Unit <i>run</i>: pairs are
(task, seed, paraphrase, run) — used when both configs ran the same run indices (a run scored on one side
only, e.g. an infrastructure error, drops that pair); unit <i>variation</i> (run counts differ): pairs are
(task, seed, paraphrase) with success averaged over each side's runs.
Difference = B − A in percentage points; 95 % CI: percentile bootstrap resampling tasks
({{ meta.bootstrap.n_boot }} resamples, seed {{ meta.bootstrap.seed }}); p: exact McNemar test on discordant
pairs; p (Holm): adjusted over the {{ m.paired | length }} comparison(s) of this report. <b>Significant</b> =
Holm-adjusted p &lt; 0.05.</p>
<div class="scroll"><table>
<tr><th class="l">setting</th><th class="l">A</th><th class="l">B</th><th class="l">unit</th><th>pairs</th><th>tasks</th>
<th>A %</th><th>B %</th><th>B − A (pp)</th><th>95 % CI</th><th>A better</th><th>B better</th><th>p</th>
<th>p (Holm)</th><th class="l">verdict</th></tr>
{% for r in m.paired %}<tr><td class="l">{{ r.setting }}</td><td class="l">{{ r.a_config }}</td><td class="l">{{ r.b_config }}</td>
<td class="l">{{ r.unit }}</td><td>{{ r.n_units }}</td><td>{{ r.n_tasks }}</td><td>{{ r.mean_a | num }}</td>
<td>{{ r.mean_b | num }}</td><td><b>{{ "%+.1f" | format(r.diff) if r.diff is not none else "–" }}</b></td>
<td class="nw">[{{ r.ci_low | num }}, {{ r.ci_high | num }}]</td><td>{{ r.a_better }}</td><td>{{ r.b_better }}</td>
<td class="nw">{{ r.p_value | p }}</td><td class="nw">{{ r.p_holm | p }}</td>
<td class="l nw">{% if r.significant %}<span class="badge sig">significant</span>{% else %}<span class="badge nsig">not significant</span>{% endif %}</td></tr>
{% else %}<tr><td class="l" colspan="15">Fewer than two configs in any setting: nothing to compare.</td></tr>
{% endfor %}</table></div>
{{ fig("paired", "forest plot of paired differences with confidence intervals") }}

<h2 id="variance">Variance decomposition</h2>
<p class="note">Success scored 0/100, population variances (÷ n): between-task = variance of task means;
within-task = mean over tasks of the variance of its variation (seed × paraphrase) means; same-prompt =
mean over variations of the run-to-run variance. In a balanced design they add up to the total.</p>
<div class="scroll"><table>
<tr><th class="l">config</th><th>tasks</th><th>variations</th><th>between-task %²</th><th>within-task %²</th>
<th>same-prompt %²</th><th>sum %²</th><th>total %²</th><th>between</th><th>within</th><th>same-prompt</th></tr>
{% for r in m.variance %}<tr><td class="l">{{ r.label }}</td><td>{{ r.n_tasks }}</td><td>{{ r.n_variations }}</td>
<td>{{ r.between_task | num }}</td><td>{{ r.within_task | num }}</td><td>{{ r.same_prompt | num }}</td>
<td>{{ r.sum | num }}</td><td>{{ r.total | num }}</td><td>{{ r.share.between_task | share }}</td>
<td>{{ r.share.within_task | share }}</td><td>{{ r.share.same_prompt | share }}</td></tr>
{% endfor %}</table></div>
{{ fig("variance", "stacked bar chart of variance components per config") }}

<h2 id="tools">Tool use</h2>
<h3 id="calls">Tool calls per episode by outcome</h3>
<div class="scroll"><table>
<tr><th class="l">config</th><th class="l">outcome</th><th>episodes</th><th>calls (mean ± sd)</th><th>median</th>
<th>expected min (mean)</th><th>excess (mean)</th><th>below min %</th></tr>
{% for r in m.tool_calls %}<tr><td class="l">{{ r.label }}</td><td class="l {{ r.outcome }}">{{ r.outcome }}</td>
<td>{{ r.n | num }}</td><td>{{ pm(r.mean_calls, r.sd_calls) }}</td><td>{{ r.median_calls | num }}</td>
<td>{{ r.mean_expected | num }}</td><td>{{ r.mean_excess | num }}</td><td>{{ r.share_below_min | num }}</td></tr>
{% endfor %}</table></div>
{{ fig("tool_calls", "tool calls per episode by outcome and against the expected minimum") }}
<h3 id="tool-errors">Tool error rate by tool</h3>
{{ fig("tool_errors_by_tool", "heatmap of tool error rate by tool and config") }}
{{ error_table(m.tool_errors_by_tool, "tool") }}
<h3 id="resource-errors">Tool error rate by resource type</h3>
{{ fig("tool_errors_by_resource", "heatmap of tool error rate by FHIR resource type and config") }}
{{ error_table(m.tool_errors_by_resource, "resource type") }}

<h2 id="failures">Failure modes</h2>
<p class="note">Of failed episodes (strict validator); an episode may show several modes.</p>
<div class="scroll"><table>
<tr><th class="l">config</th><th>failed</th>{% for k in failure_modes %}<th>{{ k | replace("_", " ") }}</th>{% endfor %}<th>unlabelled</th></tr>
{% for r in m.failure_modes %}<tr><td class="l">{{ r.label }}</td><td>{{ r.n_failed }}</td>
{% for k in failure_modes %}<td>{{ r.counts.get(k, 0) }}</td>{% endfor %}<td>{{ r.unlabelled }}</td></tr>
{% endfor %}</table></div>
{{ fig("failure_modes", "horizontal bar chart of failure mode counts per config") }}

<h2 id="tokens">Token usage</h2>
<p class="note">Total = prompt + completion tokens summed over an episode. By outcome includes infrastructure
errors as their own row; the other groupings use scored episodes.</p>
{{ token_table(m.tokens_by_config, "") }}
<p class="note">Below: mean total tokens per episode (episodes) per config.</p>
<h3>By outcome</h3>{{ wide_table(wide.tok_outcome, "outcome") }}
<h3>By difficulty</h3>{{ wide_table(wide.tok_difficulty, "difficulty") }}
<h3>By expected tool calls</h3>{{ wide_table(wide.tok_expected, "expected calls") }}
{{ fig("tokens", "token usage per episode by outcome, difficulty and expected tool calls") }}
<h3 id="token-cv">Coefficient of variation of tokens</h3>
<p class="note">CV = population sd / mean of total tokens. Same-prompt: runs of one variation, averaged over
variations; within-task: variation means of one task, averaged over tasks; overall: all episodes.</p>
<table><tr><th class="l">config</th><th>episodes</th><th>same-prompt</th><th>within-task</th><th>overall</th></tr>
{% for r in m.token_cv %}<tr><td class="l">{{ r.label }}</td><td>{{ r.n | num }}</td><td>{{ r.same_prompt | num(3) }}</td>
<td>{{ r.within_task | num(3) }}</td><td>{{ r.overall | num(3) }}</td></tr>
{% endfor %}</table>
{{ fig("token_cv", "grouped bar chart of token coefficient of variation per level and config") }}

{% if m.qa %}
<h2 id="qa">Question answering</h2>
<p class="note">QA episodes: accuracy (the deterministic matcher) by answer shape and by gold resource type
(an episode counts under each of its types), FHIR-AgentBench's retrieval precision and recall of the
resources the tools returned (types of the gold only; binary recall), and model turns per episode.</p>
<div class="scroll"><table><tr><th class="l">config</th><th class="l">by</th><th class="l">key</th><th>episodes</th>
<th>errors</th><th>accuracy %</th><th>precision %</th><th>recall %</th><th>turns</th></tr>
{% for r in m.qa %}<tr><td class="l">{{ r.label }}</td><td class="l">{{ r.by }}</td><td class="l">{{ r.key }}</td>
<td>{{ r.n | num }}</td><td>{{ r.n_errors | num }}</td><td>{{ r.accuracy | num }}</td><td>{{ r.precision | num }}</td>
<td>{{ r.recall | num }}</td><td>{{ r.turns | num }}</td></tr>
{% endfor %}</table></div>
{% endif %}

{% if m.errors %}
<h2 id="errors">Infrastructure errors</h2>
<p class="note">{{ m.errors | length }} episode(s) with status <code>error</code>; excluded from success metrics.</p>
<div class="scroll"><table><tr><th class="l">config</th><th class="l">episode</th><th class="l">error</th></tr>
{% for e in m.errors[:200] %}<tr><td class="l">{{ e.label }}</td>
<td class="l"><a href="{{ pages[(e.dir, e.episode_id)] }}">{{ e.episode_id }}</a></td><td class="l">{{ e.error }}</td></tr>
{% endfor %}</table></div>
{% endif %}

<h2 id="tasks">Per-task results</h2>
<p class="note">Success % (successes / scored episodes) per config; each box opens the episode's transcript
(<span class="pass">✓</span> pass, <span class="fail">✗</span> fail, <span class="error">!</span> error), ordered
by seed, paraphrase and run; a gap separates variations (seed × paraphrase).</p>
<div class="scroll"><table id="per-task">
<tr><th class="l">task</th><th class="l">category</th><th>diff.</th><th>writes</th><th>min calls</th>
{% for g in meta.groups %}<th class="l">{{ g.label }}</th>{% endfor %}</tr>
{% for t in m.per_task %}<tr id="{{ anchor(t.task_id) }}"><td class="l"><code>{{ t.task_id }}</code></td>
<td class="l">{{ t.category }}</td><td>{{ t.difficulty }}</td><td>{{ t.writes | num }}</td><td>{{ t.expected_min_calls }}</td>
{% for g in meta.groups %}{% set c = t.groups.get(g.label) %}<td class="l">{% if c %}
<b>{{ c.rate | num(0) }} %</b> ({{ c.successes }}/{{ c.n }}){% if c.light_rate is not none %}, light {{ c.light_rate | num(0) }} %{% endif %}
<br><span class="muted">{{ c.mean_calls | num }} calls, {{ c.mean_tokens | num(0) }} tok</span><br>
{% for e in c.episodes %}{% if not loop.first and (e.seed, e.paraphrase) != (loop.previtem.seed, loop.previtem.paraphrase) %}<span class="vsep"></span>{% endif %}<a class="ep {{ e.status }}" href="{{ pages[(e.dir, e.episode_id)] }}" title="{{ e.episode_id }} ({{ e.status }})">{{ {"pass": "✓", "fail": "✗"}.get(e.status, "!") }}</a>{% endfor %}
{% else %}–{% endif %}</td>{% endfor %}</tr>
{% endfor %}</table></div>

<h2 id="methods">Definitions</h2>
<p class="note">See <code>docs/REPORT.md</code> in the fhirgym repository for every formula and estimator.
Numbers in this page are also available with <code>fhirgym report DIR --format json</code>.</p>
</body>
</html>
"""

MACROS = """
{% macro wide_table(w, name) %}
<div class="scroll"><table><tr><th class="l">{{ name }}</th>{% for lb in w.labels %}<th>{{ lb }}</th>{% endfor %}</tr>
{% for key, cells in w.rows %}<tr><td class="l">{{ key }}</td>{% for c in cells %}<td class="nw">{{ c }}</td>{% endfor %}</tr>
{% endfor %}</table></div>
{% endmacro %}
{% macro error_table(rows, name) %}
<details><summary>table ({{ rows | length }} rows)</summary><div class="scroll"><table>
<tr><th class="l">config</th><th class="l">{{ name }}</th><th>calls</th><th>errors</th><th>error rate %</th></tr>
{% for r in rows %}<tr><td class="l">{{ r.label }}</td><td class="l">{{ r.key }}</td><td>{{ r.calls | num }}</td>
<td>{{ r.errors | num }}</td><td>{{ r.rate | num }}</td></tr>
{% endfor %}</table></div></details>
{% endmacro %}
{% macro token_table(rows, name) %}
<div class="scroll"><table><tr><th class="l">config</th>{% if name %}<th class="l">{{ name }}</th>{% endif %}<th>episodes</th>
<th>total tokens (mean ± sd)</th><th>prompt (mean)</th><th>completion (mean)</th></tr>
{% for r in rows %}<tr><td class="l">{{ r.label }}</td>{% if name %}<td class="l">{{ r.key }}</td>{% endif %}<td>{{ r.n | num }}</td>
<td>{{ pm(r.mean_total, r.sd_total, 0) }}</td><td>{{ r.mean_prompt | num(0) }}</td><td>{{ r.mean_completion | num(0) }}</td></tr>
{% endfor %}</table></div>
{% endmacro %}
"""

TRANSCRIPT = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{{ r.episode_id }} — fhirgym transcript</title>
<style>{{ css }}</style>
</head>
<body>
<p><a href="../{{ report_name }}#{{ anchor(r.task_id | string) }}">← back to the report</a></p>
<h1><code>{{ r.episode_id }}</code> <span class="{{ r.status }}">{{ r.status }}</span></h1>
{% if not t %}<p class="badge sig">Transcript file not found ({{ r.transcript }}): showing the result line only.</p>{% endif %}
<dl class="kv">
<dt>task</dt><dd><code>{{ r.task_id }}</code> ({{ r.category }}, difficulty {{ r.difficulty }},
{{ "writes" if r.writes else "read-only" }}, expected ≥ {{ r.expected_min_calls }} calls)</dd>
<dt>config / setting</dt><dd>{{ r.config }} / {{ r.setting }}</dd>
<dt>agent / model</dt><dd>{{ r.agent }} / {{ r.model }}</dd>
<dt>seed · paraphrase · run</dt><dd>{{ r.seed }} · {{ r.paraphrase }} · {{ r.run }}</dd>
<dt>stop reason</dt><dd>{{ r.stop_reason }} after {{ r.iterations }} model turn(s)</dd>
<dt>tokens</dt><dd>{{ (r.tokens or {}).get("prompt") | num }} prompt + {{ (r.tokens or {}).get("completion") | num }} completion</dd>
<dt>time</dt><dd>{{ r.duration_s | num(2) }} s ({{ r.sandbox_s | num(3) }} s in fhirgym)</dd>
{% if t and t.now %}<dt>frozen now</dt><dd>{{ t.now }}</dd>{% endif %}
{% if r.error %}<dt>infrastructure error</dt><dd class="error">{{ r.error }}</dd>{% endif %}
</dl>
{% if t and t.traceback %}<details><summary>traceback</summary><pre>{{ t.traceback }}</pre></details>{% endif %}

<h2 id="verdict">Verdict</h2>
<dl class="kv">
<dt>strict</dt><dd class="{{ 'pass' if verdict.success else 'fail' }}">{{ verdict.success | num if verdict.success is not none else "–" }}</dd>
<dt>light</dt><dd>{{ verdict.light_success | num if verdict.light_success is not none else "–" }}</dd>
{% if verdict.answer_ok is defined %}<dt>answer ok</dt><dd>{{ verdict.answer_ok | num if verdict.answer_ok is not none else "–" }}</dd>{% endif %}
<dt>failure modes</dt><dd>{{ (r.failure_modes or []) | join(", ") or "–" }}</dd>
{% if r.proximity %}<dt>proximity to gold</dt><dd>LCS {{ r.proximity.lcs | num(2) }}, Jaccard {{ r.proximity.jaccard | num(2) }}</dd>{% endif %}
</dl>
{% if verdict.reasons %}<h3>Reasons</h3><ul>{% for x in verdict.reasons %}<li>{{ x }}</li>{% endfor %}</ul>{% endif %}
{% if verdict.collateral %}<h3>Collateral changes</h3><ul>{% for x in verdict.collateral %}<li>{{ x if x is string else x | json }}</li>{% endfor %}</ul>{% endif %}

<h2 id="prompt">Prompt</h2>
<pre>{{ t.prompt if t and t.prompt else "(not recorded)" }}</pre>
{% if t and t.system %}<details><summary>system prompt</summary><pre>{{ t.system }}</pre></details>{% endif %}
{% if t and t.params %}<details><summary>task parameters</summary><pre>{{ t.params | json }}</pre></details>{% endif %}

<h2 id="answer">Answer</h2>
<dl class="kv"><dt>agent</dt><dd><pre>{{ r.final_answer if r.final_answer is not none else "(none)" }}</pre></dd>
{% if t and t.gold_answer is defined %}<dt>gold</dt><dd><pre>{{ t.gold_answer if t.gold_answer is string else t.gold_answer | json }}</pre></dd>{% endif %}
{% if t and t.expected_changes %}<dt>expected changes</dt><dd><ul>{% for x in t.expected_changes %}<li>{{ x }}</li>{% endfor %}</ul></dd>{% endif %}
</dl>

<h2 id="calls">Tool calls ({{ calls | length }})</h2>
{% if calls %}<table><tr><th>#</th><th class="l">tool</th><th class="l">resource type</th><th>ms</th><th class="l">error</th></tr>
{% for c in calls %}<tr><td><a href="#call-{{ loop.index }}">{{ loop.index }}</a></td><td class="l"><code>{{ c.name }}</code></td>
<td class="l">{{ c.resource_type or "–" }}</td><td>{{ c.ms | num(1) }}</td><td class="l fail">{{ c.error or "" }}</td></tr>
{% endfor %}</table>{% endif %}
{% for c in calls %}<div class="call{{ ' err' if c.error }}" id="call-{{ loop.index }}">
<h3>{{ loop.index }}. <code>{{ c.name }}</code>{% if c.resource_type %} · {{ c.resource_type }}{% endif %}
&nbsp;<span class="muted">{{ c.ms | num(1) }} ms</span>{% if c.error %} <span class="fail">error: {{ c.error }}</span>{% endif %}</h3>
<details open><summary>input</summary><pre>{{ c.arguments | json }}</pre></details>
<details{{ " open" if (c.output | length) < 800 }}><summary>output{% if c.truncated %} (first {{ max_chars | num }} characters){% endif %}</summary><pre>{{ c.output }}</pre></details>
</div>
{% else %}<p class="note">No tool calls.</p>{% endfor %}

<h2 id="diff">Store diff</h2>
{% for d in diff %}<h3><span class="{{ {'create': 'pass', 'delete': 'fail'}.get(d.op, '') }}">{{ d.op }}</span>
<code>{{ d.type }}/{{ d.id }}</code></h3>
<pre class="diff">{% for cls, line in d.lines %}<span class="{{ cls }}">{{ line }}</span>
{% endfor %}</pre>
{% else %}<p class="note">{{ "No changes to the store." if t else "Not recorded (no transcript)." }}</p>{% endfor %}

{% if messages %}<h2 id="messages">Conversation</h2>
<details><summary>{{ messages | length }} messages</summary>
{% for msg in messages %}<h3>{{ msg.role }}{% if msg.name %} ({{ msg.name }}){% endif %}</h3>
<pre>{{ msg.content }}{% if msg.tool_calls %}
tool calls: {{ msg.tool_calls | json }}{% endif %}</pre>
{% endfor %}</details>{% endif %}
</body>
</html>
"""


# ------------------------------------------------------------------ pages


def _wide(rows: list[dict[str, Any]], field: str, labels: list[str], cell: Any) -> dict[str, Any]:
    """Long rows (one per label × key) → one row per key with a cell per label ("–" when absent)."""
    by = {(r["label"], r[field]): r for r in rows}
    keys = sorted({r[field] for r in rows}, key=lambda k: (["pass", "fail", "error"].index(k)
                                                           if k in ("pass", "fail", "error") else 9, str(k)))
    return {"labels": labels,
            "rows": [(k, [cell(by[(lb, k)]) if (lb, k) in by else "–" for lb in labels]) for k in keys]}


def _wide_tables(m: dict[str, Any]) -> dict[str, Any]:
    labels = [g["label"] for g in m["meta"]["groups"]]

    def succ(r: dict[str, Any]) -> str:
        floor = "" if r.get("floor") is None else f", floor {_num(r['floor'])}"
        floor += "" if r.get("floor_guess") is None else f", guess {_num(r['floor_guess'])}"
        return f"{_pm(r['mean'], r['sd'])} ({r['n']}, {r.get('n_errors', 0)} errors{floor})"

    def tok(r: dict[str, Any]) -> str:
        return f"{_num(r['mean_total'], 0)} ({r['n']})"

    ks = sorted({r["k"] for r in m["pass_k"]})
    by_k = {(r["label"], r["k"]): r for r in m["pass_k"]}
    passk = {"ks": ks, "rows": [(lb, by_k[(lb, 1)]["n_instances"], [by_k.get((lb, k)) for k in ks])
                                for lb in labels if (lb, 1) in by_k]}
    return {"passk": passk,
            "category": _wide(m["success_by_category"], "category", labels, succ),
            "difficulty": _wide(m["success_by_difficulty"], "difficulty", labels, succ),
            "tok_outcome": _wide(m["tokens_by_outcome"], "key", labels, tok),
            "tok_difficulty": _wide(m["tokens_by_difficulty"], "key", labels, tok),
            "tok_expected": _wide(m["tokens_by_expected_calls"], "key", labels, tok)}


def _diff_lines(d: dict[str, Any]) -> list[tuple[str, str]]:
    before = _json(d.get("before")).splitlines() if d.get("before") is not None else []
    after = _json(d.get("after")).splitlines() if d.get("after") is not None else []
    if not before:
        return [("add", "+" + line) for line in after]
    if not after:
        return [("del", "-" + line) for line in before]
    out = []
    for line in list(difflib.unified_diff(before, after, "before", "after", n=3, lineterm=""))[2:]:
        cls = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "")
        out.append((cls, line))
    return out or [("", "(no difference)")]


def _episode_page(template: jinja2.Template, r: dict[str, Any], report_name: str) -> str:
    t = load_transcript(r)
    calls = []
    for c in (t.get("tool_calls") if t else None) or r.get("tool_calls") or []:
        out = c.get("output")
        if out is None:
            out = c.get("output_summary") or ""
        if not isinstance(out, str):
            out = _json(out)
        calls.append({**c, "output": out[:MAX_OUTPUT_CHARS], "truncated": len(out) > MAX_OUTPUT_CHARS})
    verdict = (t or {}).get("verdict") or {"success": r.get("success"), "light_success": r.get("light_success"),
                                            "reasons": r.get("reasons") or [], "collateral": []}
    verdict = {"reasons": [], "collateral": [], **verdict}
    diff = [{**d, "lines": _diff_lines(d)} for d in ((t or {}).get("diff") or [])]
    messages = []
    for msg in (t or {}).get("messages") or []:
        content = msg.get("content")
        text = content if isinstance(content, str) else _json(content)
        if len(text) > MAX_OUTPUT_CHARS:
            text = text[:MAX_OUTPUT_CHARS] + f"\n… ({len(text) - MAX_OUTPUT_CHARS:,} more characters)"
        messages.append({**msg, "content": text})
    return template.render(r=r, t=t, calls=calls, verdict=verdict, diff=diff, messages=messages, css=CSS,
                           report_name=report_name, max_chars=MAX_OUTPUT_CHARS)


def render_html(results: list[dict[str, Any]], metrics: dict[str, Any], out: Path,
                sources: list[dict[str, Any]]) -> Path:
    """Write ``out`` (report.html) and ``out.parent/transcripts/*.html``, one page per episode."""
    from ._metrics import FAILURE_MODES
    from ._plots import all_figures

    env = _env()
    pages: dict[tuple[Any, Any], str] = {}
    tdir = out.parent / TRANSCRIPT_DIR
    tdir.mkdir(parents=True, exist_ok=True)
    page_template = env.from_string(TRANSCRIPT)
    for r in results:
        name = page_name(r.get(SOURCE_KEY), str(r.get("episode_id")))
        pages[(r.get(SOURCE_KEY), r.get("episode_id"))] = f"{TRANSCRIPT_DIR}/{name}"
        (tdir / name).write_text(_episode_page(page_template, r, out.name), encoding="utf-8")
    modes = list(dict.fromkeys(FAILURE_MODES + [k for r in metrics["failure_modes"] for k in r["counts"]]))
    toc = [("success", "Success rate"), ("light", "Writing tasks: light validator"),
           ("passk", "pass@k and pass^k"), ("paired", "Paired comparisons"), ("variance", "Variance decomposition"),
           ("tools", "Tool use and tool errors"), ("failures", "Failure modes"), ("tokens", "Token usage"),
           *([("qa", "Question answering")] if metrics["qa"] else []),
           *([("errors", "Infrastructure errors")] if metrics["errors"] else []), ("tasks", "Per-task results")]
    template = env.from_string(MACROS + REPORT)
    html = template.render(m=metrics, meta=metrics["meta"], figures=all_figures(metrics), pages=pages, css=CSS,
                           wide=_wide_tables(metrics),
                           toc=toc, sources=sources, failure_modes=modes, fhirgym_version=_version(),
                           generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))
    out.write_text(html, encoding="utf-8")
    return out


def _version() -> str:
    try:
        return version("fhirgym")
    except PackageNotFoundError:
        return "unknown"


# ------------------------------------------------------------------ markdown and json


def _md_table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(x: Any) -> str:  # Markdown renders inline HTML: escape it like the HTML report does
        text = str(x).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def render_markdown(metrics: dict[str, Any]) -> str:
    """The report's numbers as Markdown tables (no figures, no transcripts)."""
    m, meta = metrics, metrics["meta"]
    out = ["# fhirgym report\n",
           f"{meta['n_results']} episodes ({meta['n_scored']} scored, {meta['n_errors']} infrastructure errors "
           f"excluded from success metrics), {meta['n_tasks']} tasks.\n",
           "## Success rate (strict; mean ± sample sd over runs)\n",
           _md_table(["config", "setting", "episodes", "errors", "scored", "runs", "success %", "pooled %",
                      "nothing-found floor %", "guess floor %"],
                     [[r["config"], r["setting"], r["n_episodes"], r["n_errors"], r["n"], r["runs"],
                       _pm(r["mean"], r["sd"]), _num(r["pooled"]), _num(r["floor"]), _num(r.get("floor_guess"))]
                      for r in m["success"]])]
    for field in ("category", "difficulty"):
        out += [f"### By {field}\n", _md_table(["config", field, "scored", "errors", "success %", "pooled %",
                                                 "floor %", "guess %"], [
            [r["label"], r[field], r["n"], r["n_errors"], _pm(r["mean"], r["sd"]), _num(r["pooled"]),
             _num(r["floor"]), _num(r.get("floor_guess"))] for r in m[f"success_by_{field}"]])]
    out += ["## Writing tasks: light vs strict validator\n",
            _md_table(["config", "episodes", "errors", "strict %", "light %"],
                      [[r["label"], r["n"], r["n_errors"], _pm(r["strict_mean"], r["strict_sd"]),
                        _pm(r["light_mean"], r["light_sd"])]
                       for r in m["light_success"]]),
            "## pass@k and pass^k\n",
            _md_table(["config", "k", "variations", "pass@k %", "pass^k %"],
                      [[r["label"], r["k"], r["n_instances"], _num(r["pass_at_k"]), _num(r["pass_hat_k"])]
                       for r in m["pass_k"]]),
            "## Paired comparisons\n",
            "B − A in percentage points; 95 % CI by bootstrap over tasks; exact McNemar p, Holm-adjusted; "
            "unit `run` = paired by (task, seed, paraphrase, run) (same run indices on both sides), `variation` = "
            "by (task, seed, paraphrase) averaged over runs (run counts differ).\n\n",
            _md_table(["setting", "A", "B", "unit", "pairs", "A %", "B %", "B − A", "95 % CI", "p", "p (Holm)",
                       "verdict"],
                      [[r["setting"], r["a_config"], r["b_config"], r["unit"], r["n_units"], _num(r["mean_a"]), _num(r["mean_b"]),
                        _num(r["diff"]), f"[{_num(r['ci_low'])}, {_num(r['ci_high'])}]", _p(r["p_value"]),
                        _p(r["p_holm"]), "**significant**" if r["significant"] else "not significant"]
                       for r in m["paired"]]),
            "## Variance decomposition of success (%², population variances)\n",
            _md_table(["config", "tasks", "variations", "between-task", "within-task", "same-prompt", "total",
                       "shares (b/w/s)"],
                      [[r["label"], r["n_tasks"], r["n_variations"], _num(r["between_task"]), _num(r["within_task"]),
                        _num(r["same_prompt"]), _num(r["total"]),
                        " / ".join(_share(r["share"][k]) for k in ("between_task", "within_task", "same_prompt"))]
                       for r in m["variance"]]),
            "## Tool calls per episode by outcome\n",
            _md_table(["config", "outcome", "episodes", "calls", "median", "expected min", "excess", "below min %"],
                      [[r["label"], r["outcome"], r["n"], _pm(r["mean_calls"], r["sd_calls"]), _num(r["median_calls"]),
                        _num(r["mean_expected"]), _num(r["mean_excess"]), _num(r["share_below_min"])]
                       for r in m["tool_calls"]])]
    for key, name in (("tool_errors_by_tool", "tool"), ("tool_errors_by_resource", "resource type")):
        out += [f"## Tool error rate by {name}\n",
                _md_table(["config", name, "calls", "errors", "error rate %"],
                          [[r["label"], r["key"], r["calls"], r["errors"], _num(r["rate"])] for r in m[key]])]
    modes = list(dict.fromkeys(k for r in m["failure_modes"] for k in r["counts"]))
    out += ["## Failure modes of failed episodes\n",
            _md_table(["config", "failed", *modes, "unlabelled"],
                      [[r["label"], r["n_failed"], *(r["counts"].get(k, 0) for k in modes), r["unlabelled"]]
                       for r in m["failure_modes"]])]
    for key, name in (("tokens_by_config", ""), ("tokens_by_outcome", "outcome"),
                      ("tokens_by_difficulty", "difficulty"), ("tokens_by_expected_calls", "expected calls")):
        out += [f"## Tokens{' by ' + name if name else ''}\n",
                _md_table(["config", *([name] if name else []), "episodes", "total (mean ± sd)", "prompt", "completion"],
                          [[r["label"], *([r["key"]] if name else []), r["n"], _pm(r["mean_total"], r["sd_total"], 0),
                            _num(r["mean_prompt"], 0), _num(r["mean_completion"], 0)] for r in m[key]])]
    out += ["## Coefficient of variation of tokens\n",
            _md_table(["config", "episodes", "same-prompt", "within-task", "overall"],
                      [[r["label"], r["n"], _num(r["same_prompt"], 3), _num(r["within_task"], 3), _num(r["overall"], 3)]
                       for r in m["token_cv"]])]
    labels = [g["label"] for g in meta["groups"]]
    if m["qa"]:
        out += ["## Question answering\n", _md_table(
            ["config", "by", "key", "episodes", "errors", "accuracy %", "precision %", "recall %", "turns"],
            [[r["label"], r["by"], r["key"], r["n"], r["n_errors"], _num(r["accuracy"]), _num(r["precision"]),
              _num(r["recall"]), _num(r["turns"])] for r in m["qa"]])]
    out += ["## Per-task success % (successes/scored)\n",
            _md_table(["task", "category", "difficulty", "writes", *labels],
                      [[t["task_id"], t["category"], t["difficulty"], _num(t["writes"]),
                        *((f"{_num(t['groups'][lb]['rate'], 0)} ({t['groups'][lb]['successes']}/{t['groups'][lb]['n']})"
                           if lb in t["groups"] else "–") for lb in labels)] for t in m["per_task"]])]
    if m["errors"]:
        out += ["## Infrastructure errors\n",
                _md_table(["config", "episode", "error"], [[e["label"], e["episode_id"], e["error"]] for e in m["errors"]])]
    return "\n".join(out)


def _money(x: float, currency: str) -> str:
    return f"{x:,.2f} {currency}"


def _hours(minutes: float) -> str:
    return f"{int(minutes // 60)} h {round(minutes % 60):02d} min" if minutes >= 60 else f"{minutes:.1f} min"


def render_estimate(est: dict[str, Any]) -> str:
    """A plan's cost and power before it runs (the dict of ``memory.estimate_plan``), as Markdown: the dry-run
    prints it and an experiment's report opens with it."""
    a, total = est["assumptions"], est["total"]
    priced = est["prices"] is not None
    cur = est["prices"]["currency"] if priced else ""

    def cost(row: dict) -> str:
        if not priced:
            return "–"
        text = _money(row["cost"], cur)
        return text + (f" + unpriced ({', '.join(row['unpriced'])})" if row["unpriced"] else "")

    known = any(c["distinct"] is not None for c in est["comparisons"])
    fewer = any(c["mde_distinct"] is not None for c in est["comparisons"])

    def refs(row: dict) -> str:
        return ", ".join(f"[{i}]" for i in row["figures"])

    out = [f"## Before the run: cost and power of plan `{est['plan']}`\n",
           "Expected figures: per-episode means times the plan's counts (training runs counted at most: every "
           "trial runs). Prices: " + (f"`{est['prices']['file']}` ({cur} per million input / output tokens)"
                                      + (f" — {est['prices']['note']}" if est['prices'].get('note') else "")
                                      if priced else "none given (`--prices FILE`), so no cost") + ".\n",
           "### Training (one memory per model, training instances and specs; settings that train alike share it)\n",
           _md_table(["model", "setting", "specs", "runs (≤)", "model calls", "tokens in", "tokens out", "cost",
                      "wall", "figures"],
                     [[m["model"], m["setting"], _num(m["with_specs"]), m["runs"], _num(m["calls"]),
                       _num(m["prompt_tokens"]), _num(m["completion_tokens"]), cost(m), _hours(m["minutes"]), refs(m)]
                      for m in est["memories"]]),
           f"### Evaluation (per cell; wall time at the plan's parallel = {est['parallel']}, 1 for a local model)\n",
           _md_table(["model", "setting", "config", "episodes", "model calls", "tokens in", "tokens out", "cost",
                      "wall", "figures"],
                     [[c["model"], c["setting"], c["config"], c["episodes"], _num(c["calls"]), _num(c["prompt_tokens"]),
                       _num(c["completion_tokens"]), cost(c), _hours(c["minutes"]), refs(c)] for c in est["cells"]]),
           "### Total\n",
           f"{total['training_runs']:,} training runs (at most) + {total['evaluation_episodes']:,} evaluation "
           f"episodes; {total['calls']:,} model calls; {total['prompt_tokens']:,} input + "
           f"{total['completion_tokens']:,} output tokens; cost {cost(total)}; wall time "
           f"**{_hours(total['minutes'])}**.\n",
           "### Power of the paired comparisons against the baseline\n",
           f"Minimum detectable effect (MDE, percentage points): the smallest rise over an assumed baseline "
           f"success of {100 * a['base_rate']:.1f} % ({a['base_rate_source']}) that the report's exact McNemar "
           f"test (two-sided, p < {a['alpha']}) detects with {100 * a['power']:.0f} % power, with paired outcomes "
           + ("independent given the pair" if not a["correlation"] else f"correlated (phi = {a['correlation']})")
           + f"; exact power (docs/MEMORY.md). The report corrects over {a['holm_comparisons']} comparisons (Holm): "
           f"its first step tests at p < {a['alpha']}/{a['holm_comparisons']}.\n",
           _md_table(["model", "setting", "comparison", "pairs", "instances",
                      *(["distinct", "seen in training"] if known else []), "MDE",
                      *(["MDE over distinct instances"] if fewer else []), "MDE at Holm's first step"],
                     [[c["model"], c["setting"], f"{c['config']} vs baseline", c["pairs"], c["instances"],
                       *([c["distinct"], c["seen_in_training"]] if known else []), _pts(c["mde"]),
                       *([_pts(c["mde_distinct"]) if c["mde_distinct"] is not None else "–"] if fewer else []),
                       _pts(c["mde_holm"])] for c in est["comparisons"]]),
           *([("Pairs are what the test counts (instances × runs). Where there are fewer distinct instances — "
               "runs > 1, whose pairs a deterministic backend at temperature 0 only repeats, or two seeds that drew "
               "the same task (same prompt and parameters) — the MDE over the distinct instances is the honest "
               "one.") + (" *Seen in training*: evaluation instances that are also a training instance of their "
                          "setting (separated by seed, not by content)." if known else "") + "\n"]
             if fewer or known else []),
           "Figures from:\n", *[f"[{i}] {src}\n" for i, src in enumerate(est["sources"], 1)]]
    return "\n".join(out)


def _pts(x: float | None) -> str:
    return "not detectable" if x is None else f"{x:.1f}"


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return None if math.isnan(x) else round(x, 6)
    if isinstance(x, dict):
        return {str(k): _round(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_round(v) for v in x]
    return x


def render_json(metrics: dict[str, Any], sources: list[dict[str, Any]]) -> str:
    """The metrics dict itself (floats rounded to 6 digits) plus the sources' run.json."""
    return json.dumps(_round({"sources": sources, **metrics}), indent=1, ensure_ascii=False, default=str)


# ------------------------------------------------------------------ entry point


def write_report(dirs: list[Path], out: Path, fmt: str = "html", *, n_boot: int = 2000, seed: int = 0) -> Path:
    """Load ``dirs``, compute every metric and write the report as ``fmt`` (html, md or json) to ``out``.

    ``out`` may be a file path, or a directory (existing, or new without a suffix) that then gets
    ``report.<fmt>``. HTML also
    writes one page per episode into ``<out dir>/transcripts/``. Returns the written file.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r} (html, md, json)")
    dirs = [Path(d) for d in dirs]
    out = Path(out)
    if out.is_dir() or (not out.exists() and not out.suffix):
        out = out / f"report.{FORMATS[fmt]}"
    out.parent.mkdir(parents=True, exist_ok=True)
    results = load_results(dirs)
    metrics = compute_metrics(results, n_boot=n_boot, seed=seed)
    sources = load_run_info(dirs)
    if fmt == "html":
        return render_html(results, metrics, out, sources)
    out.write_text(render_markdown(metrics) if fmt == "md" else render_json(metrics, sources), encoding="utf-8")
    return out
