"""One report over several run directories (``formtax report A B --out C``; ``formtax compare`` reads runs side by
side instead, :mod:`formtax.report.ablation`).

Pooling rules (why each refusal): runs are pooled only when their records can be read as one experiment.

* **Data**: an item id names the same item in every run (its ``item_hash`` and gold agree), and data files with the
  same name have the same sha256; otherwise the "same item" would be two questions.
* **Scoring**: the same formtax version (the parsers and scorers that wrote ``parses`` / ``scores``), and one answer
  spec per task x item x strategy; otherwise a difference in accuracy could be a difference in scoring.
* **Prompts**: runs of the same model show byte-identical prompts for the same task, item, variant and shots; runs of
  different models are held to the same prompt variants and shots (their chat templates differ by design).
* **No double counting**: a request (task, strategy, item, seed, variant) of one model appears in one run only.

Runs of one model merge into its cells (runs made at different times: one adds strategies, another items). Runs of
several models keep each model apart: the task of every record is relabelled ``TASK | MODEL``, so every table,
paired comparison and decomposition is per model and the summary lists the models side by side. The pooled
``records.jsonl`` and ``sources.json`` (each source's path and records sha256) are written to the output folder,
``formtax verify`` re-derives the pooled records from the sources (:func:`check_sources`) and recomputes the tables.

The study analyses (metatool abstention, EAE, SummEval, FEM) select their task by name; they run on each model's
records with the name restored and their rows keep the relabelled task (:func:`formtax.report.catalog.extra_tables`),
so paper 002's per-model tables sit side by side in one report.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from formtax.errors import ConfigError, DataError
from formtax.records.schema import Record
from formtax.records.store import read_records
from formtax.report.analyses import MODEL_SEP
from formtax.report.load import records_path, sha256_of
from formtax.report.write import read_manifest

SOURCES_FILE = "sources.json"


def _label(task: str, model: str) -> str:
    return f"{task}{MODEL_SEP}{model}"


def _load(run_dir: Path) -> tuple[list[Record], dict[str, Any]]:
    path = records_path(run_dir)
    if not path.is_file():
        raise DataError(f"{run_dir}: no records.jsonl (not a run directory)")
    records = read_records(path)
    if not records:
        raise DataError(f"{run_dir}: records.jsonl holds no records")
    return records, read_manifest(run_dir) or {}


def _check_same(what: str, seen: dict[Any, tuple[Any, str]], key: Any, value: Any, where: str) -> None:
    if key in seen and seen[key][0] != value:
        raise ConfigError(f"cannot pool: {what} differs ({seen[key][1]}: {seen[key][0]!r}; {where}: {value!r})")
    seen.setdefault(key, (value, where))


def pool_records(run_dirs: Sequence[Path]) -> list[Record]:
    """The records of ``run_dirs`` as one experiment, checked by the module's pooling rules (ConfigError naming
    the first rule a pair of runs breaks)."""
    if len(run_dirs) < 2:
        raise ConfigError("pooling needs at least two run directories")
    if len({Path(d).resolve() for d in run_dirs}) != len(run_dirs):
        raise ConfigError("the same run directory is named twice")
    loaded = [(Path(d), *_load(Path(d))) for d in run_dirs]
    models = {rec.model for _, records, _ in loaded for rec in records}
    versions: dict[Any, tuple[Any, str]] = {}
    files: dict[Any, tuple[Any, str]] = {}
    items: dict[Any, tuple[Any, str]] = {}
    specs: dict[Any, tuple[Any, str]] = {}
    prompts: dict[Any, tuple[Any, str]] = {}
    plans: dict[Any, tuple[Any, str]] = {}
    cells: dict[Any, tuple[Any, str]] = {}
    pooled: list[Record] = []
    for run_dir, records, manifest in loaded:
        name = str(run_dir)
        if manifest.get("formtax_version") is not None:
            _check_same("the formtax version (parsers and scorers)", versions, "v", manifest["formtax_version"], name)
        for path, sha in (manifest.get("data_files") or {}).items():
            _check_same(f"data file {Path(path).name}", files, Path(path).name, sha, name)
        config = manifest.get("config") or {}
        for rec in records:
            where = f"{name} request {rec.request_id}"
            _check_same(f"item {rec.task}/{rec.item_id}", items, (rec.task, rec.item_id), (rec.item_hash, rec.gold),
                        where)
            _check_same(f"the answer spec of {rec.task}/{rec.item_id}/{rec.strategy}", specs,
                        (rec.task, rec.item_id, rec.strategy), rec.answer_spec, where)
            _check_same(f"the prompt of {rec.task}/{rec.item_id} variant {rec.prompt_variant} (model {rec.model})",
                        prompts, (rec.model, rec.task, rec.item_id, rec.prompt_variant, rec.output_format,
                                  rec.shots, rec.seed if rec.shots else 0), rec.prompt_hash, where)
            cell = (rec.model, rec.task, rec.strategy, rec.item_id, rec.seed, rec.prompt_variant)
            if cell in cells:
                raise ConfigError(f"cannot pool: {where} repeats a request of {cells[cell][1]} (same model, task, "
                                  "strategy, item, seed and variant); pooling would count it twice")
            cells[cell] = (None, name)
            out = rec.model_copy(deep=True)
            if len(models) > 1:
                out.task = _label(rec.task, rec.model)
            pooled.append(out)
        if len(models) > 1 and config:
            _check_same("the prompt plan (prompt variants, shots)", plans, "plan",
                        (config.get("prompt_variants"), config.get("shots")), name)
    return pooled


def _sources(run_dirs: Sequence[Path]) -> list[dict[str, str]]:
    return [{"run_dir": str(Path(d).resolve()), "records_sha256": sha256_of(records_path(Path(d)))} for d in run_dirs]


def write_pooled(run_dirs: Sequence[Path], out_dir: Path) -> Path:
    """Write the pooled ``records.jsonl`` and ``sources.json`` into ``out_dir``; returns ``out_dir``.

    Refuses an ``out_dir`` that is one of the sources or holds records that are not a pooling (records are never
    overwritten by accident); a pooled folder is rewritten from its sources."""
    out_dir = Path(out_dir)
    if any(out_dir.resolve() == Path(d).resolve() for d in run_dirs):
        raise ConfigError(f"--out {out_dir} is one of the runs being pooled; name a new folder")
    if records_path(out_dir).exists() and not (out_dir / SOURCES_FILE).is_file():
        raise ConfigError(f"--out {out_dir} holds a run's records.jsonl; name a new folder for the pooled report")
    pooled = pool_records(run_dirs)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(rec.model_dump_json() + "\n" for rec in pooled)
    records_path(out_dir).write_text(text, encoding="utf-8")
    sources = {"sources": _sources(run_dirs), "rules": "formtax.report.combine (module docstring)"}
    (out_dir / SOURCES_FILE).write_text(json.dumps(sources, indent=2) + "\n", encoding="utf-8")
    return out_dir


def check_sources(run_dir: Path) -> list[str]:
    """For a pooled report: every source still holds the records it was pooled from, and pooling them again gives
    this folder's records.jsonl byte for byte. Empty for an ordinary run directory."""
    path = Path(run_dir) / SOURCES_FILE
    if not path.is_file():
        return []
    try:
        sources = json.loads(path.read_text(encoding="utf-8"))["sources"]
        dirs = [Path(s["run_dir"]) for s in sources]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        return [f"{SOURCES_FILE} is unreadable ({exc!r})"]
    problems = []
    for source, d in zip(sources, dirs, strict=True):
        rp = records_path(d)
        if not rp.is_file():
            problems.append(f"source {d}: records.jsonl is gone")
        elif sha256_of(rp) != source.get("records_sha256"):
            problems.append(f"source {d}: records.jsonl changed since it was pooled")
    if problems:
        return problems
    try:
        again = "".join(rec.model_dump_json() + "\n" for rec in pool_records(dirs))
    except (ConfigError, DataError) as exc:
        return [f"pooling the sources again fails: {exc}"]
    if again != records_path(Path(run_dir)).read_text(encoding="utf-8"):
        return ["records.jsonl is not the pooling of its sources (edited after `formtax report --out`?)"]
    return []
