"""Analysis of result directories: every metric of the paper plus pass^k and paired tests, as a report.

``load_results`` reads ``results.jsonl`` files (docs/RESULTS.md), ``compute_metrics`` turns them into
one JSON-serialisable dict (pure, no I/O), ``write_report`` writes it as a self-contained HTML page
with figures and per-episode transcript pages, or as Markdown / JSON. Formulas: docs/REPORT.md.
``paired_mde`` is the power side of the paired test, before a run: the smallest effect it detects;
``render_estimate`` prints a plan's cost and power (the memory layer computes them) at a report's top.
"""

from ._load import ResultsError, load_results, load_transcript
from ._metrics import compute_metrics
from ._report import render_estimate, write_report
from ._stats import mcnemar_power, paired_mde

__all__ = ["ResultsError", "compute_metrics", "load_results", "load_transcript", "mcnemar_power", "paired_mde",
           "render_estimate", "write_report"]
