"""Analysis of result directories: every metric of the paper plus pass^k and paired tests, as a report.

``load_results`` reads ``results.jsonl`` files (docs/RESULTS.md), ``compute_metrics`` turns them into
one JSON-serialisable dict (pure, no I/O), ``write_report`` writes it as a self-contained HTML page
with figures and per-episode transcript pages, or as Markdown / JSON. Formulas: docs/REPORT.md.
"""

from ._load import ResultsError, load_results, load_transcript
from ._metrics import compute_metrics
from ._report import write_report

__all__ = ["ResultsError", "compute_metrics", "load_results", "load_transcript", "write_report"]
