"""A run directory as one object: open its typed manifest and records, hold its lock, resume the run it records,
write and verify its report. The CLI's ``run`` / ``report`` / ``verify`` do the same steps; this is the Python
face of them for notebooks and scripts."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from formtax.errors import DataError
from formtax.records.schema import Record
from formtax.records.store import RECORDS, read_records
from formtax.runner.config import RunConfig
from formtax.runner.manifest import Manifest, load_manifest


class RunDir:
    """``RunDir(path)``: see the module docstring. Nothing is read until asked."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def manifest(self) -> Manifest:
        """The manifest, migrated from any earlier layout (:mod:`formtax.runner.manifest`)."""
        m = load_manifest(self.path)
        if m is None:
            raise DataError(f"{self.path}: no manifest.json (not a run directory; `formtax run --out` makes one)")
        return m

    def records(self) -> list[Record]:
        return read_records(self.path / RECORDS)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the directory as a run does (a second holder is refused at once)."""
        from formtax.runner.run import run_lock

        with run_lock(self.path):
            yield

    def resume(self, config: RunConfig | None = None, backend: Any = None,
               progress: Callable[[int, int], None] | None = None) -> Any:
        """Run what the recorded grid still lacks (``config``: the manifest's own by default; a larger grid
        extends the run as ``formtax run`` does). Returns the run's summary."""
        from formtax.runner.run import run

        return run(config or self.manifest().run_config(), self.path, progress, backend)

    def report(self, **options: Any) -> Path:
        from formtax.report.write import write_report

        return write_report(self.path, **options)

    def verify(self) -> list[str]:
        """Every difference between the written report and what the records give (empty: verified)."""
        from formtax.report.verify import verify_report

        return verify_report(self.path)
