"""The append-only record file and the run manifest.

Records are appended one line at a time and flushed (and fsync'd) as they go, so an interrupted run leaves a
valid file. A line cut short by a hard kill is not silently dropped: it is moved aside to
``records.jsonl.partial`` (appended, with a timestamp) before the run resumes. Nothing is ever rewritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from formtax.errors import DataError
from formtax.records.schema import Record

log = logging.getLogger(__name__)

RECORDS = "records.jsonl"
MANIFEST = "manifest.json"


def read_records(path: Path | str) -> list[Record]:
    """Every complete record in ``path``; a malformed complete line is an error naming its number. ``path`` may be
    a string, and a run directory stands for its ``records.jsonl`` (``read_records("runs/x")``, issue 60)."""
    out: list[Record] = []
    path = Path(path)
    if path.is_dir():
        path = path / RECORDS
    if not path.exists():
        return out
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.endswith(b"\n"):
                break  # an unfinished last line (handled by RecordWriter.recover)
            try:
                out.append(Record.model_validate_json(raw))
            except ValueError as e:
                raise DataError(f"{path} line {n}: not a valid formtax record: {str(e).splitlines()[0]}") from e
    return out


class RecordWriter:
    """Append records, one flushed line each."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.recover()
        self._f = path.open("ab")

    def recover(self) -> None:
        """Move an unfinished last line (a hard kill mid-write) aside, so the file ends on a complete line."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if not data or data.endswith(b"\n"):
            return
        cut = data.rfind(b"\n") + 1
        side = self.path.with_name(self.path.name + ".partial")
        with side.open("ab") as f:
            f.write(f"# {time.strftime('%Y-%m-%dT%H:%M:%S')} unfinished line moved aside\n".encode() + data[cut:] + b"\n")
        with self.path.open("r+b") as f:
            f.truncate(cut)
        log.warning("moved an unfinished last line of %s to %s", self.path, side)

    def append(self, record: Record) -> None:
        self._f.write(record.model_dump_json().encode() + b"\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def git_state() -> dict[str, Any]:
    """The commit of the formtax source tree, and whether it has uncommitted changes."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True, timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, check=True, timeout=10).stdout.strip())
        return {"commit": commit, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


PACKAGES = ("formtax", "torch", "transformers", "llguidance", "numpy", "scipy", "statsmodels", "pydantic", "pandas",
            "gguf", "tokenizers")


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for p in PACKAGES:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            out[p] = None
    return out


def write_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    """Atomic write (temp file + rename): a crash never leaves half a manifest."""
    tmp = run_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    tmp.replace(run_dir / MANIFEST)


def read_manifest(run_dir: Path) -> dict[str, Any] | None:
    p = run_dir / MANIFEST
    if not p.exists():
        return None
    try:
        data: dict[str, Any] = json.loads(p.read_text(encoding="utf-8"))
        return data
    except json.JSONDecodeError as e:
        raise DataError(f"{p}: not valid JSON ({e})") from e
