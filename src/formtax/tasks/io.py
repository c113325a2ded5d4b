"""Reading benchmark files with errors a user can act on.

Every failure names the task, the file, the line (JSON Lines) or row (JSON array) and the expected format, so a
user pointing formtax at their own copy of a data set sees at once what is wrong with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from formtax.errors import DataError

T = TypeVar("T")


class RowError(ValueError):
    """Raised by a row parser for a row that does not have the expected format."""


def _read_text(task: str, path: Path, expected: str) -> str:
    if not path.is_file():
        raise DataError(f"{task}: {path}: file not found; expected {expected}")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{task}: {path}: cannot read ({exc}); expected {expected}") from exc


def read_json(task: str, path: Path, expected: str) -> Any:
    """Parse a whole JSON file; errors name the task, the file and what was expected."""
    text = _read_text(task, path, expected)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{task}: {path}: cannot read (not valid JSON: {exc.msg}); expected {expected}") from exc


def read_jsonl(task: str, path: Path, expected: str, parse_row: Callable[[int, Any], T]) -> list[T]:
    """Parse a JSON Lines file row by row; ``parse_row(index, obj)`` raises ``RowError`` on a bad row.

    ``expected`` describes one row, e.g. "a JSON object with 'question' and 'answer'". Blank lines are skipped
    (a trailing newline is common) but still counted, so line numbers match an editor's.
    """
    text = _read_text(task, path, f"JSON Lines, each line {expected}")
    rows: list[T] = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{task}: {path} line {line_no}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg}); expected {expected}") from exc
        try:
            rows.append(parse_row(len(rows), obj))
        except RowError as exc:
            raise DataError(f"{where}: {exc}; expected {expected}") from exc
    return rows


def read_json_array(task: str, path: Path, expected: str, parse_row: Callable[[int, Any], T]) -> list[T]:
    """Parse a file holding one JSON array; errors name the 0-based row index."""
    text = _read_text(task, path, f"a JSON array, each element {expected}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{task}: {path} line {exc.lineno}: not valid JSON ({exc.msg}); expected a JSON array, each element {expected}"
        ) from exc
    if not isinstance(data, list):
        raise DataError(
            f"{task}: {path}: top level is not a JSON array; expected a JSON array, each element {expected}"
        )
    rows: list[T] = []
    for index, obj in enumerate(data):
        try:
            rows.append(parse_row(index, obj))
        except RowError as exc:
            raise DataError(f"{task}: {path} row {index}: {exc}; expected {expected}") from exc
    return rows


def require_object(obj: Any) -> dict[str, Any]:
    """The row as a dict, or ``RowError`` when it is not a JSON object."""
    if not isinstance(obj, dict):
        raise RowError(f"got a JSON {type(obj).__name__}, not an object")
    return obj


def require_str(row: dict[str, Any], key: str) -> str:
    """A non-empty string field."""
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise RowError(f"field {key!r} is missing or not a non-empty string")
    return value


def require_int(row: dict[str, Any], key: str) -> int:
    """An integer field; a float with no fractional part (e.g. SVAMP's ``51.0``) is accepted."""
    value = row.get(key)
    if isinstance(value, bool):
        raise RowError(f"field {key!r} is a boolean, not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise RowError(f"field {key!r} is missing or not a whole number (got {value!r})")


def check_unique_ids(task: str, path: Path, ids: Iterator[str] | list[str]) -> None:
    """Item ids must be unique: runs key their records on them."""
    seen: set[str] = set()
    for item_id in ids:
        if item_id in seen:
            raise DataError(f"{task}: {path}: duplicate item id {item_id!r}")
        seen.add(item_id)
