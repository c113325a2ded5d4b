"""The run directory's ``manifest.json`` as typed, versioned records: :class:`RunSpec` (the run's settings, one field
per :class:`~formtax.runner.config.RunConfig` field, so the two cannot drift) and :class:`Manifest` (the spec plus
provenance, status and history), with a migration from every layout the project has written.

Layouts (``tests/fixtures/manifests`` keeps a real one of each, written by that commit's own code):

* version 0 (no ``schema_version``; commits 07e205b to this one): the same top-level keys, growing over time:
  ``hypotheses`` (3ba92f1), ``task_notes`` (5976de3), ``extensions`` and each resumption's ``machine`` load
  later; ``config`` holds the RunConfig fields of its day (15 at first, 31 at 5976de3);
* version 1: ``schema_version`` is written; ``config`` holds every field;
* version 2: ``config.closing`` is always the setting the run ran with (closing's default became on wherever
  formtax steps the model, settled when a run starts: runner/run.py).

Migrating 0 to 1 fills what an older layout lacks with the defaults those runs ran under (a field added later
defaults to the behaviour before it existed) and leaves ``config_identity`` untouched: the records' run identity is
its hash. A manifest of a newer version than this formtax knows is refused with a message to upgrade.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from formtax.errors import DataError
from formtax.records.store import read_manifest, write_manifest
from formtax.runner.config import RunConfig

MANIFEST_VERSION = 2
EARLIER_DEFAULTS = {"closing": False}
"""The settings runs recorded before version 2 ran with where their config leaves them out (a later default is
not what they ran with)."""


def _spec_fields() -> dict[str, Any]:
    hints = typing.get_type_hints(RunConfig)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(RunConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = (hints[f.name], f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = (hints[f.name], Field(default_factory=f.default_factory))
        else:
            out[f.name] = (hints[f.name], ...)
    return out


RunSpec: type[BaseModel] = create_model(
    "RunSpec", __config__=ConfigDict(extra="forbid"), __doc__="A run's settings as recorded (RunConfig's fields).",
    **_spec_fields())


class RunStatus(StrEnum):
    RUNNING = "running"  # a process is writing it, or one died without saying (the lock tells which)
    COMPLETE = "complete"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


class Resumption(BaseModel):
    """One session of a run (the first, or a resumption)."""

    model_config = ConfigDict(extra="forbid")

    at: str
    pending: int
    batch_size: int
    device: str
    machine: dict[str, Any] | None = None  # CPUs and load average at the start (absent before it was recorded)
    machine_at_end: dict[str, Any] | None = None
    # the session's whole grid (issue 60: a run that grew counts against the union of its plans, not the first
    # session's pending requests); per strategy as recorded, per seed; absent in manifests written before
    planned: int | None = None
    planned_by: dict[str, dict[str, int]] | None = None


class Manifest(BaseModel):
    """``manifest.json`` (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = MANIFEST_VERSION
    config: RunSpec  # type: ignore[valid-type]
    # provenance: every run writes it; a manifest written by hand for records assembled without a run (a synthetic
    # study, a test) may give only config, backend and status, and then nothing is held to what it leaves out
    formtax_version: str = "unknown"
    git: dict[str, Any] = Field(default_factory=dict)
    packages: dict[str, Any] = Field(default_factory=dict)
    config_identity: dict[str, Any] = Field(default_factory=dict)
    backend: dict[str, Any] = Field(default_factory=dict)
    data_files: dict[str, str] = Field(default_factory=dict)
    items: list[str] = Field(default_factory=list)
    seeds: list[int] = Field(default_factory=list)
    started: str = ""
    resumptions: list[Resumption] = Field(default_factory=list)
    status: RunStatus = RunStatus.RUNNING
    ended: str | None = None
    hypotheses: dict[str, Any] | None = None
    task_notes: Any = None
    extensions: list[dict[str, Any]] = Field(default_factory=list)

    def run_config(self) -> RunConfig:
        return RunConfig(**self.config.model_dump())  # type: ignore[attr-defined]


def _from_v0(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 0 (unversioned) to 1: the defaults fill what the layout lacks (RunSpec's and Manifest's)."""
    return {**raw, "schema_version": 1}


def _from_v1(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 1 to 2: a setting whose default changed is filled with the one these runs ran under."""
    return {**raw, "config": {**EARLIER_DEFAULTS, **raw.get("config", {})}, "schema_version": 2}


MIGRATIONS = {0: _from_v0, 1: _from_v1}
"""``version -> function`` taking a manifest of that version to the next one."""


def migrate(raw: dict[str, Any], where: str = "manifest.json") -> Manifest:
    """A manifest of any layout this formtax knows, as the current typed :class:`Manifest`."""
    version = raw.get("schema_version", 0)
    if not isinstance(version, int) or version < 0:
        raise DataError(f"{where}: schema_version must be a non-negative integer, got {version!r}")
    if version > MANIFEST_VERSION:
        raise DataError(f"{where}: schema_version {version} is newer than this formtax knows (up to "
                        f"{MANIFEST_VERSION}); upgrade formtax to read this run")
    data = dict(raw)
    while version < MANIFEST_VERSION:
        data = MIGRATIONS[version](data)
        version = data["schema_version"]
    try:
        return Manifest.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        at = ".".join(str(x) for x in first["loc"])
        raise DataError(f"{where}: {at}: {first['msg']}") from None


def load_manifest(run_dir: Path) -> Manifest | None:
    """The run directory's manifest, migrated and typed; None when it has none."""
    raw = read_manifest(Path(run_dir))
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise DataError(f"{Path(run_dir) / 'manifest.json'}: expected a JSON object, got {type(raw).__name__}")
    return migrate(raw, str(Path(run_dir) / "manifest.json"))


def save_manifest(run_dir: Path, manifest: Manifest | dict[str, Any]) -> Manifest:
    """Validate and write (atomically); returns the typed manifest written."""
    typed = manifest if isinstance(manifest, Manifest) else migrate(manifest)
    write_manifest(Path(run_dir), json.loads(typed.model_dump_json()))
    return typed
