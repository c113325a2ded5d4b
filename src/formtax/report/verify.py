"""Check a written report against its records: recompute every table and compare every CSV cell.

The tables are recomputed from ``records.jsonl`` with the ``n_resamples`` and ``seed`` stored in
``tables/meta.json``, written to CSV text exactly as :func:`~formtax.report.write_report` writes them, and
compared cell by cell with the written files, rows matched by their key columns. Text cells must be equal.
Numeric cells are equal when their text is identical or, after parsing, when both are empty (NaN) or differ
by at most :data:`TOLERANCE` (values are already rounded to 6 decimals, so this accepts only a different
spelling of the same number, e.g. ``0.5`` vs ``0.500000``).
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pandas as pd

from formtax.errors import DataError
from formtax.report.catalog import table_keys
from formtax.report.load import load_records, records_path, sha256_of
from formtax.report.tables import compute_tables
from formtax.report.write import META_FILE, TABLES_DIR, read_manifest, table_to_csv
from formtax.runner.grid import as_listed
from formtax.stats import Resampling

TOLERANCE = 1e-9


def _read_csv(text: str) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)


def _close(written: str, recomputed: str) -> bool:
    try:
        w = float(written) if written.strip() else math.nan
        r = float(recomputed) if recomputed.strip() else math.nan
    except ValueError:
        return False
    if math.isnan(w) or math.isnan(r):
        return math.isnan(w) and math.isnan(r)
    return abs(w - r) <= TOLERANCE


def _shown(text: str) -> str:
    return text if text != "" else "(empty)"


def compare_table(name: str, written_text: str, expected: pd.DataFrame) -> list[str]:
    """Mismatches between a written CSV's text and the recomputed table ``expected``."""
    label = f"{name}.csv"
    try:
        written = _read_csv(written_text)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        return [f"{label}: cannot be read as CSV ({exc})"]
    recomputed = _read_csv(table_to_csv(expected))
    numeric = {
        str(c)
        for c in expected.columns
        if pd.api.types.is_numeric_dtype(expected[c]) and not pd.api.types.is_bool_dtype(expected[c])
    }
    keys = list(table_keys(name))
    problems = [f"{label}: column {c} is missing" for c in recomputed.columns if c not in written.columns]
    problems += [f"{label}: unexpected column {c}" for c in written.columns if c not in recomputed.columns]
    if any(k not in written.columns for k in keys):
        return problems
    written_rows: dict[tuple[str, ...], int] = {}
    for position, key in enumerate(zip(*(written[k] for k in keys), strict=True)):
        if key in written_rows:
            problems.append(f"{label}: duplicate row ({', '.join(key)})")
        else:
            written_rows[key] = position
    expected_keys = [tuple(key) for key in zip(*(recomputed[k] for k in keys), strict=True)]
    for position, key in enumerate(expected_keys):
        row_name = f"row ({', '.join(key)})"
        if key not in written_rows:
            problems.append(f"{label}: {row_name} is missing")
            continue
        w_row = written.iloc[written_rows[key]]
        r_row = recomputed.iloc[position]
        for column in recomputed.columns:
            if column in keys or column not in written.columns:
                continue
            w, r = str(w_row[column]), str(r_row[column])
            if w == r or (column in numeric and _close(w, r)):
                continue
            problems.append(
                f"{label} {row_name} column {column}: written {_shown(w)}, recomputed {_shown(r)}"
            )
    expected_set = set(expected_keys)
    problems += [f"{label}: extra row ({', '.join(key)})" for key in written_rows if key not in expected_set]
    return problems


def check_hypotheses(run_dir: Path) -> list[str]:
    """The pre-registration lock: a hypotheses file registered in ``manifest.json`` (``formtax run
    --hypotheses``) must still hash to the registered sha256, and so must the text the manifest kept."""
    import hashlib

    try:
        manifest = read_manifest(run_dir)
    except DataError as exc:
        return [str(exc)]
    entry = (manifest or {}).get("hypotheses")
    if not entry:
        return []
    registered = str(entry.get("sha256"))
    if hashlib.sha256(str(entry.get("text", "")).encode()).hexdigest() != registered:
        return ["manifest.json: the registered hypotheses text does not match its registered sha256"]
    path = Path(str(entry.get("path")))
    if not path.is_file():
        return [f"hypotheses file {path} (registered in manifest.json) is missing; the pre-registration "
                "cannot be checked"]
    now = hashlib.sha256(path.read_text(encoding="utf-8").encode()).hexdigest()
    if now != registered:
        return [f"hypotheses file {path} changed after it was registered: sha256 now {now}, "
                f"registered {registered}"]
    return []


def check_manifest(run_dir: Path) -> list[str]:
    """``manifest.json`` against the records: each record written under the settings the manifest names (its
    ``run_identity`` is the hash of the manifest's ``config_identity``), for an item and a seed the manifest
    lists, under a strategy of its grid, each request once. A hand-edited manifest or a record of another run
    shows up here."""
    from formtax.records.schema import identity_hash
    from formtax.records.store import read_records

    try:
        manifest = read_manifest(run_dir)
        records = read_records(records_path(run_dir))
    except DataError as exc:
        return [str(exc)]
    if manifest is None:  # records assembled without a run (synthetic studies): nothing to hold them to
        return []
    problems: list[str] = []
    identity = manifest.get("config_identity")
    want = identity_hash(identity) if isinstance(identity, dict) and identity else None
    items = set(manifest.get("items") or [])
    seeds = set(manifest.get("seeds") or [])
    listed = (manifest.get("config") or {}).get("strategies") or []
    strategies = {str(s).strip() for s in listed} if isinstance(listed, list) else set()  # as the grid spells them
    seen: set[str] = set()
    for n, rec in enumerate(records, start=1):
        where = f"records.jsonl record {n} (request {rec.request_id})"
        if rec.request_id in seen:
            problems.append(f"{where}: the request appears twice")
        seen.add(rec.request_id)
        if rec.run_identity and rec.run_identity != want:
            problems.append(f"{where}: written under other settings than manifest.json names (run_identity "
                            f"{rec.run_identity}, the manifest's {want})")
        if items and rec.item_id not in items:
            problems.append(f"{where}: item {rec.item_id!r} is not among the manifest's items")
        if seeds and rec.seed not in seeds:
            problems.append(f"{where}: seed {rec.seed} is not among the manifest's seeds")
        if strategies and rec.strategy not in strategies and as_listed(rec.strategy) not in strategies:
            problems.append(f"{where}: strategy {rec.strategy!r} is not in the manifest's grid")
    return problems


def check_parses(run_dir: Path) -> list[str]:
    """Every output re-parsed and re-scored from its text (issue 60): a hand-set ``scores.strict`` or a verdict
    the parsers no longer give shows up here, naming the record (:func:`formtax.runner.reparse.reparse_problems`)."""
    from formtax.records.store import read_records
    from formtax.runner.reparse import reparse_problems

    try:
        records = read_records(records_path(run_dir))
    except DataError as exc:
        return [str(exc)]
    return reparse_problems(records, read_manifest(run_dir))


def check_findings(run_dir: Path, expected: dict[str, pd.DataFrame]) -> list[str]:
    """report.md must print exactly the recomputed findings (its headline sentences), in its Findings section."""
    from formtax.report.render import findings_lines

    path = Path(run_dir) / "report.md"
    if not path.is_file() or "findings" not in expected:
        return [] if "findings" not in expected else ["report.md is missing: its findings cannot be checked"]
    text = path.read_text(encoding="utf-8")
    section = text.split("## Findings", 1)[1].split("\n## ", 1)[0] if "## Findings" in text else ""
    printed = [line for line in section.splitlines() if line.startswith("- ")]
    want = findings_lines(expected)
    problems = [f"report.md: the finding {w!r} is missing (recomputed from the records)" for w in want
                if w not in printed]
    problems += [f"report.md: the finding {p!r} is not what the records give" for p in printed if p not in want]
    return problems


def verify_report(run_dir: Path) -> list[str]:
    """Recompute every table and compare it with the written report; an empty list means verified.

    Reports, as human-readable lines: a missing ``meta.json`` or table file, a ``records.jsonl`` whose sha256
    differs from the one recorded at report time, records that can no longer be read, every cell, row or
    column that differs (naming the table, the row key and the column), a registered hypotheses file that
    changed (:func:`check_hypotheses`), and records the manifest does not account for (:func:`check_manifest`).
    """
    run_dir = Path(run_dir)
    tables_dir = run_dir / TABLES_DIR
    meta_path = tables_dir / META_FILE
    if not meta_path.is_file():
        return [f"{TABLES_DIR}/{META_FILE} is missing: no report to verify in {run_dir}"]
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        n_resamples, seed, recorded_sha = (
            int(meta["n_resamples"]),
            int(meta["seed"]),
            str(meta["records_sha256"]),
        )
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
        return [f"{TABLES_DIR}/{META_FILE} is unreadable or incomplete ({exc!r})"]
    path = records_path(run_dir)
    if not path.is_file():
        return [f"{path.name} is missing: cannot recompute the tables"]
    from formtax.report.combine import check_sources

    problems: list[str] = check_hypotheses(run_dir) + check_manifest(run_dir) + check_sources(run_dir)
    sha = sha256_of(path)
    if sha != recorded_sha:
        problems.append(
            f"{path.name} changed since the report was written: its sha256 is now {sha}, the report was made "
            f"from {recorded_sha}"
        )
    try:
        df = load_records(run_dir)
    except DataError as exc:
        problems.append(f"cannot recompute the tables: {exc}")
        return problems
    # a report written before the key existed used the crossed rule, the only one then
    resampling = Resampling(meta.get("resampling", Resampling.ITEMS_AND_SEEDS.value))
    from formtax.report.findings import run_extent
    from formtax.report.write import read_manifest

    expected = compute_tables(df, n_resamples=n_resamples, seed=seed, resampling=resampling,
                              baseline=meta.get("baseline"), extent=run_extent(read_manifest(run_dir)),
                              p_adjust=str(meta.get("p_adjust") or "none"))
    problems += check_findings(run_dir, expected)
    problems += check_parses(run_dir)
    for name, table in expected.items():
        csv_path = tables_dir / f"{name}.csv"
        if not csv_path.is_file():
            problems.append(f"{name}.csv is missing")
            continue
        problems += compare_table(name, csv_path.read_text(encoding="utf-8"), table)
    problems += [
        f"{extra.name}: unexpected table file (compute_tables makes no such table)"
        for extra in sorted(tables_dir.glob("*.csv"))
        if extra.stem not in expected
    ]
    return problems
