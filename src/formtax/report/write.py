"""Write a run directory's report: ``tables/*.csv``, ``tables/meta.json``, ``figures/*.png``, ``report.md``,
``report.html``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd

from formtax.errors import DataError
from formtax.report.catalog import table_keys
from formtax.report.drilldown import DEFAULT_DRILL_ITEMS
from formtax.report.figures import write_figures
from formtax.report.load import load_records, records_path, sha256_of
from formtax.report.matrices import CONFIDENCE, DECIMALS
from formtax.report.render import ReportContext, render_html, render_markdown
from formtax.report.tables import compute_tables
from formtax.stats import DEFAULT_RESAMPLING, Resampling

TABLES_DIR = "tables"
FIGURES_DIR = "figures"
META_FILE = "meta.json"


def table_to_csv(table: pd.DataFrame) -> str:
    """The CSV text of a table (no index; NaN as an empty cell; floats as Python writes them)."""
    return table.to_csv(index=False, lineterminator="\n")


def formtax_version() -> str:
    import formtax

    return str(formtax.__version__)


def read_manifest(run_dir: Path) -> dict[str, Any] | None:
    """``run_dir/manifest.json`` migrated to the current layout (:mod:`formtax.runner.manifest`), as a dict;
    None when absent. A manifest of a newer layout than this formtax knows is refused (DataError)."""
    from formtax.runner.manifest import load_manifest

    manifest = load_manifest(Path(run_dir))
    return None if manifest is None else dict(json.loads(manifest.model_dump_json()))


def write_report(
    run_dir: Path, n_resamples: int = 10_000, seed: int = 0, resampling: Resampling = DEFAULT_RESAMPLING,
    drill_items: int = DEFAULT_DRILL_ITEMS, baseline: str | None = None, p_adjust: str = "holm",
) -> Path:
    """Compute every table from ``run_dir/records.jsonl`` and write the report files; returns ``report.md``.

    ``drill_items``: items shown in report.html's per-item section (0: none). ``baseline``: the strategy the
    findings compare against (default: the run's first strategy; :func:`~formtax.report.findings.resolve_baseline`).
    ``p_adjust``: the multiple-comparison adjustment the findings give beside the raw p-values (holm, bonferroni,
    none; :data:`~formtax.report.findings.P_ADJUST`), kept in meta.json so that ``verify`` recomputes the same.

    Raises:
        DataError: records.jsonl is missing or malformed, or manifest.json is not a JSON object.
    """
    run_dir = Path(run_dir)
    path = records_path(run_dir)
    if not path.is_file():
        raise DataError(f"records file not found: {path}")
    sha = sha256_of(path)
    df = load_records(run_dir)
    if sha256_of(path) != sha:
        raise DataError(f"{path} changed while the report was being computed; run write_report again")
    manifest = read_manifest(run_dir)
    sources = run_dir / "sources.json"  # a pooled report (report/combine.py): its header names the runs
    if manifest is None and sources.is_file():
        manifest = {"pooled_from": [s["run_dir"] for s in json.loads(sources.read_text(encoding="utf-8"))["sources"]]}
    from formtax.report.findings import resolve_baseline, run_extent

    baseline = resolve_baseline(df, baseline, manifest)
    tables = compute_tables(df, n_resamples=n_resamples, seed=seed, resampling=resampling, baseline=baseline,
                            extent=run_extent(manifest), p_adjust=p_adjust)

    tables_dir = run_dir / TABLES_DIR
    tables_dir.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        (tables_dir / f"{name}.csv").write_text(table_to_csv(table), encoding="utf-8")
    meta: dict[str, Any] = {
        "n_resamples": n_resamples,
        "seed": seed,
        "resampling": Resampling(resampling).value,
        "baseline": baseline,
        "p_adjust": p_adjust,
        "confidence": CONFIDENCE,
        "decimals": DECIMALS,
        "formtax_version": formtax_version(),
        "records_file": path.name,
        "records_sha256": sha,
        "n_records": len(df),
        "tables": list(tables),
        "table_keys": {name: list(table_keys(name)) for name in tables},
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    (tables_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")

    figures = write_figures(tables, run_dir / FIGURES_DIR, baseline)
    ctx = ReportContext(df=df, meta=meta, manifest=manifest, figures=figures, tables=tables)
    report_md = run_dir / "report.md"
    report_md.write_text(render_markdown(tables, ctx), encoding="utf-8")
    (run_dir / "report.html").write_text(render_html(tables, ctx, drill_items), encoding="utf-8")
    return report_md
