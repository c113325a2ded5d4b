"""Read a run directory's ``records.jsonl`` into a flat :class:`pandas.DataFrame`, one row per record.

Every line must be a valid :class:`~formtax.records.schema.Record`; nothing is skipped. A malformed line, a
blank line, a scored record without a strict/lenient score, a duplicate (task, strategy, item, seed, prompt
variant) or a strategy whose base strategy / level / rc differ between records raises
:class:`~formtax.errors.DataError` naming the file and the line number.

Columns (see :data:`BASE_COLUMNS`): the record's identifying fields, ``scored`` (no error),
``score_strict`` / ``score_lenient`` (1.0, 0.0, or NaN when unscored), ``parse_status_strict`` /
``parse_status_lenient``, ``parse_ok_strict`` / ``parse_ok_lenient`` (1.0 when the parser's status is
``"ok"``, 0.0 otherwise, NaN when unscored), ``tokens_prompt``, ``tokens_total``, ``tokens_forced``, ``closing_changed_tokens`` (how many tokens closing
mode changed in the record; NaN where it was off), one
``tokens_<phase>`` column per phase seen in any record (0 where a record has token counts but not that
phase; NaN where a record has no token counts at all), ``wall_s``, ``batch_wall_s``, ``batch_cpu_s`` (the process CPU time of the record's batch; NaN in records
written before it was recorded) and ``batch_size`` (the requests in that batch).
"""

from __future__ import annotations

import hashlib
import math
import numbers
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import ValidationError

from formtax.errors import DataError
from formtax.records.schema import SCHEMA_VERSION, ParseRecord, Record

RECORDS_FILE = "records.jsonl"
MANIFEST_FILE = "manifest.json"

TOKEN_FIELDS = ("prompt", "total", "forced")
"""Token counts recorded at the top level of ``Record.tokens``; phases come from ``tokens["by_phase"]``."""

BASE_COLUMNS = (
    "line",
    "request_id",
    "task",
    "item_id",
    "strategy",
    "base_strategy",
    "level",
    "rc",
    "output_format",
    "prompt_variant",
    "seed",
    "shots",
    "model",
    "error",
    "scored",
    "score_strict",
    "score_lenient",
    "parse_status_strict",
    "parse_status_lenient",
    "parse_ok_strict",
    "parse_ok_lenient",
    "format_ok",
    "finish_reason",
    "switch_reason",
    "masked_mass",
    "constraint_ok",
    "tokens_prompt",
    "tokens_total",
    "tokens_forced",
    "closing_changed_tokens",
    "wall_s",
    "batch_wall_s",
    "batch_cpu_s",
    "batch_size",
    "record",  # the whole Record, for study analyses that need text, stats or parses
)



def format_ok(parse: ParseRecord | None) -> float:
    """Paper 003's parse rate, per output: 1 when the output "can be parsed according to the specified format
    schema", i.e. the strict parser found the requested shape (the answer line, the object) holding a non-empty
    answer, whatever its spelling: ``The answer is: H E N E`` parses at the format level and is ``invalid``
    for the strict parser, which also asks for the task's canonical spelling. Defined for every output,
    constrained or not."""
    if parse is None:
        return math.nan
    return 1.0 if parse.status == "ok" or (parse.status == "invalid" and bool(parse.raw)) else 0.0

def records_path(run_dir: Path) -> Path:
    return Path(run_dir) / RECORDS_FILE


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _number(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise DataError(f"{where}: {what} must be a number, got {value!r}")
    return float(value)


def _flatten(rec: Record, where: str, line: int) -> dict[str, Any]:
    if rec.schema_version != SCHEMA_VERSION:
        raise DataError(
            f"{where}: schema_version {rec.schema_version} is not supported (expected {SCHEMA_VERSION})"
        )
    nan = math.nan
    row: dict[str, Any] = {
        "line": line,
        "request_id": rec.request_id,
        "task": rec.task,
        "item_id": rec.item_id,
        "strategy": rec.strategy,
        "base_strategy": rec.base_strategy,
        "level": rec.level,
        "rc": rec.rc,
        "output_format": rec.output_format,
        "prompt_variant": rec.prompt_variant,
        "seed": rec.seed,
        "shots": rec.shots,
        "model": rec.model,
        "error": rec.error,
        "scored": rec.scored,
        "finish_reason": rec.finish_reason,
        "switch_reason": (rec.stats or {}).get("switch_reason"),
        "masked_mass": nan if rec.masked_mass is None else rec.masked_mass,
        "constraint_ok": rec.constraint_ok,
        "record": rec,
    }
    for parser in ("strict", "lenient"):
        parse = rec.parses.get(parser)
        row[f"parse_status_{parser}"] = None if parse is None else parse.status
        if not rec.scored:
            row[f"score_{parser}"] = nan
            row[f"parse_ok_{parser}"] = nan
            if parser == "strict":
                row["format_ok"] = nan
            continue
        if parser not in rec.scores:
            raise DataError(f"{where}: scored record (no error) has no {parser!r} score; scores={rec.scores}")
        row[f"score_{parser}"] = 1.0 if rec.scores[parser] else 0.0
        if parse is None:
            if parser == "strict":
                raise DataError(f"{where}: scored record (no error) has no 'strict' parse verdict")
            row[f"parse_ok_{parser}"] = nan
        else:
            row[f"parse_ok_{parser}"] = 1.0 if parse.status == "ok" else 0.0
        if parser == "strict":
            row["format_ok"] = format_ok(parse)
    tokens = rec.tokens
    for name in TOKEN_FIELDS:
        row[f"tokens_{name}"] = _number(tokens[name], f"tokens.{name}", where) if name in tokens else nan
    by_phase = tokens.get("by_phase", {})
    if not isinstance(by_phase, dict):
        raise DataError(f"{where}: tokens.by_phase must be an object, got {by_phase!r}")
    phases: dict[str, float] = {}
    for phase, count in by_phase.items():
        if phase in TOKEN_FIELDS:
            raise DataError(f"{where}: phase name {phase!r} collides with the token field tokens.{phase}")
        phases[phase] = _number(count, f"tokens.by_phase.{phase}", where)
    row["_phases"] = phases
    changed = rec.stats.get("closing_changed_tokens")  # absent where closing mode was off or had no answer call
    row["closing_changed_tokens"] = nan if changed is None else _number(changed, "stats.closing_changed_tokens", where)
    row["_has_tokens"] = bool(tokens)
    row["wall_s"] = (
        _number(rec.timings["wall_s"], "timings.wall_s", where) if "wall_s" in rec.timings else nan
    )
    row["batch_wall_s"] = (
        _number(rec.timings["batch_wall_s"], "timings.batch_wall_s", where)
        if "batch_wall_s" in rec.timings
        else nan
    )
    row["batch_cpu_s"] = (
        _number(rec.timings["batch_cpu_s"], "timings.batch_cpu_s", where) if "batch_cpu_s" in rec.timings else nan
    )
    row["batch_size"] = rec.batch_size
    return row


def _check_consistency(rows: list[dict[str, Any]], path: Path) -> None:
    seen: dict[tuple[Any, ...], int] = {}
    attrs: dict[tuple[str, str], tuple[tuple[str, str, bool], int]] = {}
    for row in rows:
        key = (row["task"], row["strategy"], row["item_id"], row["seed"], row["prompt_variant"])
        if key in seen:
            raise DataError(
                f"{path} line {row['line']}: duplicate record for task={key[0]!r} strategy={key[1]!r} "
                f"item_id={key[2]!r} seed={key[3]} prompt_variant={key[4]!r} (first at line {seen[key]})"
            )
        seen[key] = row["line"]
        cell = (row["task"], row["strategy"])
        value = (row["base_strategy"], row["level"], row["rc"])
        if cell not in attrs:
            attrs[cell] = (value, row["line"])
        elif attrs[cell][0] != value:
            first, first_line = attrs[cell]
            raise DataError(
                f"{path} line {row['line']}: strategy {cell[1]!r} in task {cell[0]!r} has "
                f"(base_strategy, level, rc) = {value}, but {first} at line {first_line}"
            )


def load_records(run_dir: Path) -> pd.DataFrame:
    """Load ``run_dir/records.jsonl`` into a flat DataFrame (one row per record, in file order).

    Raises:
        DataError: the file is missing or empty, or a line is blank, not JSON, not a valid ``Record``, or
            inconsistent with the others; the message names the line number.
    """
    path = records_path(run_dir)
    if not path.is_file():
        raise DataError(f"records file not found: {path}")
    raw_lines = path.read_bytes().split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()  # the newline ending the last record
    rows: list[dict[str, Any]] = []
    for line_no, raw in enumerate(raw_lines, start=1):
        where = f"{path} line {line_no}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{where}: not valid UTF-8 ({exc})") from exc
        if not text.strip():
            raise DataError(f"{where}: blank line (expected one JSON record per line)")
        try:
            rec = Record.model_validate_json(text)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(record)'}: {err['msg']}"
                for err in exc.errors()[:3]
            )
            raise DataError(f"{where}: malformed record: {problems}") from exc
        rows.append(_flatten(rec, where, line_no))
    if not rows:
        raise DataError(f"{path} contains no records")
    _check_consistency(rows, path)
    phases = sorted({phase for row in rows for phase in row["_phases"]})
    for row in rows:
        counts = row.pop("_phases")
        has_tokens = row.pop("_has_tokens")
        for phase in phases:
            row[f"tokens_{phase}"] = counts.get(phase, 0.0) if has_tokens else math.nan
    columns = list(BASE_COLUMNS) + [f"tokens_{phase}" for phase in phases]
    return pd.DataFrame(rows, columns=columns)


def phases_of(df: pd.DataFrame) -> list[str]:
    """The token phases of a frame from :func:`load_records` (the ``tokens_<phase>`` columns)."""
    fixed = {f"tokens_{name}" for name in TOKEN_FIELDS}
    return [col[len("tokens_") :] for col in df.columns if col.startswith("tokens_") and col not in fixed]
