"""The resumable runner: plan the grid, skip what is recorded, run the rest in batches, append one record each.

Resume guarantees: a request is identified by a stable id; a re-run of the same command skips every id already in
``records.jsonl`` and appends the others, so a killed run loses at most the batch in flight and never duplicates.
A run directory belongs to one configuration: re-running into it with another configuration is refused.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from formtax import __version__
from formtax.backends import Backend, load_backend
from formtax.errors import ConfigError, FormtaxError
from formtax.parsing import parse_all
from formtax.records.schema import ParseRecord, Record
from formtax.records.store import (
    RECORDS,
    RecordWriter,
    git_state,
    package_versions,
    read_manifest,
    read_records,
    sha256_file,
    write_manifest,
)
from formtax.runner.grid import RC_PREFIX, Planned, check_prompt_identity, parse_strategy_spec, plan_grid
from formtax.scoring import score_all
from formtax.strategies.base import Request, Result
from formtax.tasks import Task, get_task, parse_variant_id, resolve_data_dir, sample_items

log = logging.getLogger(__name__)

# Options that change how fast a run goes, not what it computes: they may differ between resumptions.
NON_IDENTITY = ("batch_size", "device")


@dataclass
class RunConfig:
    task: str
    strategies: list[str]
    model: str | None = None
    backend: str = "hf"
    device: str = "cpu"
    dtype: str = "float32"
    limit: int | None = None
    seeds: int = 1
    prompt_variants: str = "t1f1"  # "all" or a comma list like "t1f1,t2f3"
    shots: int = 0
    max_tokens: int = 256
    batch_size: int = 8
    temperature: float = 0.0
    item_seed: int = 0
    data_dir: str | None = None

    def identity(self) -> dict[str, Any]:
        d = asdict(self)
        for k in NON_IDENTITY:
            d.pop(k)
        return d

    def variants(self) -> list[tuple[int, int]]:
        if self.prompt_variants == "all":
            return [(t, f) for t in (1, 2, 3) for f in (1, 2, 3)]
        return [parse_variant_id(v.strip()) for v in self.prompt_variants.split(",") if v.strip()]


@dataclass
class RunSummary:
    planned: int
    skipped: int
    done: int = 0
    errors: int = 0
    wall_s: float = 0.0
    out_dir: str = ""
    by_strategy: dict[str, int] = field(default_factory=dict)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _item_hash(p: Planned) -> str:
    it = p.item
    return _sha(repr((it.id, it.question, it.gold, it.choices)))


def _backend_provenance(backend: Backend) -> dict[str, Any]:
    d = backend.describe()
    origin = d.get("origin")
    if origin and Path(origin).is_file():
        d["origin_sha256"] = sha256_file(Path(origin))
    try:
        d["tokenizer_sha256"] = backend.tokenizer.engine.key
    except Exception:  # noqa: BLE001 - provenance is best effort for exotic tokenizers
        d["tokenizer_sha256"] = None
    return d


def make_record(task: Task, p: Planned, res: Result | None, prompt_text: str, batch_size: int,
                model: str, error: str | None = None) -> Record:
    rec = Record(
        request_id=p.request_id, task=p.task, item_id=p.item.id, item_hash=_item_hash(p), strategy=p.spec.spec,
        base_strategy=p.spec.name, level=p.spec.level, rc=p.spec.rc, output_format=p.output_format,
        prompt_variant=p.prompt_variant, seed=p.seed, shots=p.shots, model=model, batch_size=batch_size,
        prompt_hash=_sha(prompt_text), prompt=prompt_text, gold=p.item.gold, answer_spec=p.answer, error=error,
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    if res is None:
        return rec
    rec.text, rec.reasoning, rec.answer_text, rec.phases = res.text, res.reasoning, res.answer_text, res.phases
    rec.finish_reason = res.finish_reason
    rec.tokens = res.tokens.model_dump()
    rec.masked_mass = res.masked_mass
    rec.timings = res.timings
    rec.stats = dict(res.stats)
    if res.error:
        rec.stats["generation_error"] = res.error
    constrained = p.spec.level != "none" and p.spec.strategy.requires_constraint
    rec.constraint_ok = res.parse_ok if constrained else None
    # Parse what the strategy presents as its answer: the constrained part when there is one.
    text = res.answer_text if res.answer_text is not None else res.text
    from formtax.tasks import OutputFormat

    parses = parse_all(text, task, p.item, OutputFormat(p.output_format))
    rec.parses = {k: ParseRecord(status=v.status, value=v.value, raw=v.raw) for k, v in parses.items()}
    rec.scores = score_all(task, p.item, parses)
    return rec


def run(config: RunConfig, out_dir: Path, progress: Callable[[int, int], None] | None = None,
        backend: Backend | None = None) -> RunSummary:
    """Run (or resume) the grid of ``config`` into ``out_dir``; ``progress(done, total)`` after each batch."""
    t_start = time.perf_counter()
    specs = [parse_strategy_spec(s) for s in config.strategies]
    if not specs:
        raise ConfigError("no strategies given")
    if len({s.spec for s in specs}) != len(specs):
        raise ConfigError(f"duplicate strategies in {config.strategies}")
    if config.seeds < 1:
        raise ConfigError("--seeds must be at least 1")
    task = get_task(config.task)
    needs_data = bool(task.data_files(Path("."))) or config.data_dir is not None
    data_dir = resolve_data_dir(Path(config.data_dir) if config.data_dir else None) if needs_data else None
    items = sample_items(task.load(data_dir), config.limit, config.item_seed)
    planned = plan_grid(task, items, specs, config.variants(), list(range(config.seeds)), config.shots)
    check_prompt_identity(planned, lambda m: repr(m))

    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(out_dir)
    if manifest is not None and manifest.get("config_identity") != config.identity():
        old = manifest.get("config_identity") or {}
        diff = sorted(k for k in set(old) | set(config.identity()) if old.get(k) != config.identity().get(k))
        raise ConfigError(f"{out_dir} holds a run with another configuration (differs in: {', '.join(diff)}); "
                          "use a new --out directory")
    done_ids = {r.request_id for r in read_records(out_dir / RECORDS)}
    pending = [p for p in planned if p.request_id not in done_ids]
    summary = RunSummary(planned=len(planned), skipped=len(planned) - len(pending), out_dir=str(out_dir))

    if backend is None:
        backend = load_backend(config.backend, config.model, device=config.device, dtype=config.dtype)
    for s in specs:  # refuse a strategy the backend cannot run, before any request
        sample = next(p for p in planned if p.spec == s)
        s.strategy.check(backend, [_request(task, sample, config)])

    files = task.data_files(data_dir) if data_dir is not None else []
    manifest = manifest or {
        "formtax_version": __version__, "git": git_state(), "packages": package_versions(),
        "config": asdict(config), "config_identity": config.identity(), "backend": _backend_provenance(backend),
        "data_files": {str(f): sha256_file(f) for f in files}, "items": [it.id for it in items],
        "seeds": list(range(config.seeds)), "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "resumptions": [],
    }
    manifest["status"] = "running"
    manifest["resumptions"].append({"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "pending": len(pending),
                                    "batch_size": config.batch_size, "device": config.device})
    write_manifest(out_dir, manifest)

    render = backend.tokenizer.chat_prompt
    n_done = summary.skipped
    if progress:
        progress(n_done, len(planned))
    try:
        with RecordWriter(out_dir / RECORDS) as writer:
            for s in specs:
                todo = [p for p in pending if p.spec == s]
                for k in range(0, len(todo), config.batch_size):
                    chunk = todo[k : k + config.batch_size]
                    for p, res, err in _run_chunk(backend, task, chunk, config):
                        rec = make_record(task, p, res, render(p.messages), len(chunk), backend.model_id, err)
                        writer.append(rec)
                        summary.done += 1
                        summary.errors += err is not None
                        summary.by_strategy[s.spec] = summary.by_strategy.get(s.spec, 0) + 1
                    n_done += len(chunk)
                    if progress:
                        progress(n_done, len(planned))
        manifest["status"] = "complete"
    except KeyboardInterrupt:
        manifest["status"] = "interrupted"
        raise
    finally:
        manifest["ended"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        write_manifest(out_dir, manifest)
    summary.wall_s = time.perf_counter() - t_start
    return summary


def _request(task: Task, p: Planned, config: RunConfig) -> Request:
    return Request(prompt=p.messages, constraint=p.constraint(), max_tokens=config.max_tokens, seed=p.seed,
                   temperature=config.temperature, reasoning_prefix=RC_PREFIX if p.spec.rc else None,
                   constrain=p.spec.level != "none", conversion=p.conversion(task))


def _run_chunk(backend: Backend, task: Task, chunk: Sequence[Planned], config: RunConfig
               ) -> list[tuple[Planned, Result | None, str | None]]:
    """Run one batch; if the batch fails, run its requests one by one so one bad request costs only itself."""
    strategy = chunk[0].spec.strategy
    try:
        results = strategy.run(backend, [_request(task, p, config) for p in chunk])
        return [(p, r, None) for p, r in zip(chunk, results, strict=True)]
    except (FormtaxError, RuntimeError, ValueError) as e:
        if len(chunk) == 1:
            log.warning("request %s failed: %s", chunk[0].request_id, e)
            return [(chunk[0], None, f"{type(e).__name__}: {e}")]
        log.warning("a batch failed (%s); retrying its requests one by one", e)
        out: list[tuple[Planned, Result | None, str | None]] = []
        for p in chunk:
            out.extend(_run_chunk(backend, task, [p], config))
        return out
