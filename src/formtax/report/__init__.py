"""Reports for a run directory: tables (CSV), figures (PNG), report.md, a self-contained report.html, and a
verifier that recomputes every written number from ``records.jsonl``.

- :func:`load_records` reads ``records.jsonl`` into a flat DataFrame (a malformed line raises ``DataError``).
- :func:`compute_tables` computes the tables ``accuracy``, ``runs``, ``decomposition``, ``paired``, ``tokens``
  and ``timing`` (deterministic given ``seed``).
- :func:`write_report` writes ``tables/``, ``figures/``, ``report.md`` and ``report.html``.
- :func:`verify_report` recomputes the tables and lists every difference from the written files.
"""

from formtax.report.load import load_records
from formtax.report.tables import compute_tables
from formtax.report.verify import verify_report
from formtax.report.write import write_report

__all__ = ["compute_tables", "load_records", "verify_report", "write_report"]
