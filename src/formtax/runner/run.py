"""The resumable runner: plan the grid, skip what is recorded, run the rest in batches, append one record each.

Resume guarantees: a request is identified by a stable id; a re-run of the same command skips every id already in
``records.jsonl`` and appends the others, so a killed run loses at most the batch in flight and never duplicates.
A run directory belongs to one configuration: re-running into it with another configuration is refused, and
so is resuming on data files whose sha256 changed since the run began.

Optional task plumbing, kept generic: ``task_options`` go to a task that implements :class:`ConfigurableTask`;
a task implementing :class:`OwnParsing` reads its outputs by its benchmark's own rule instead of formtax's
parsers; a task with ``same_prompt_all_formats = True`` must give every strategy the byte-identical prompt.
A ``hypotheses`` file is a pre-registration lock: its sha256 and text go into the manifest before any record
exists, and ``formtax verify`` fails if the file changes afterwards.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import filelock

from formtax import __version__
from formtax.api import closing_default
from formtax.backends import Backend, backend_capabilities, load_backend
from formtax.backends.model_files import check_model_name, has_chat_template
from formtax.decoding.sampling import Sampling
from formtax.errors import ConfigError, DataError, FormtaxError
from formtax.records.schema import Record, identity_hash
from formtax.records.store import (
    RECORDS,
    RecordWriter,
    git_state,
    package_versions,
    read_records,
    sha256_file,
)
from formtax.runner.config import (  # noqa: F401  (RunConfig re-exported: formtax.runner.run.RunConfig)
    SEEDINGS,
    ConfigurableTask,
    RunConfig,
    thinking_flag,
)
from formtax.runner.execute import (
    backend_provenance,
    execute_chunk,
    load_extractor,
    planned_budget,
    request_for,
    strategy_for,
)
from formtax.runner.grid import Planned, check_prompt_identity, parse_strategy_spec, plan_grid
from formtax.runner.manifest import MANIFEST_VERSION, Manifest, load_manifest, save_manifest
from formtax.tasks import (
    PromptStyle,
    Task,
    get_task,
    resolve_data_dir,
    sample_items,
)

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    planned: int
    skipped: int
    done: int = 0
    errors: int = 0
    wall_s: float = 0.0
    out_dir: str = ""
    by_strategy: dict[str, int] = field(default_factory=dict)


def grid_extension(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a re-run adds to an existing run (new strategies, more seeds), or None when it changes anything else
    (then it is refused): every earlier request stays planned with the same settings, so its records stay valid.
    Each record's own ``run_identity`` and budget are still checked on resume (:func:`check_adopted`)."""
    diff = {k for k in set(old) | set(new) if old.get(k) != new.get(k)}
    if not diff or not diff <= {"strategies", "seeds"}:
        return None
    out: dict[str, Any] = {}
    if "strategies" in diff:
        before, after = list(old.get("strategies") or []), list(new.get("strategies") or [])
        if not set(before) <= set(after):
            return None
        out["added_strategies"] = [s for s in after if s not in before]
    if "seeds" in diff:
        before_n, after_n = int(old.get("seeds", 1)), int(new.get("seeds", 1))
        if after_n < before_n:
            return None
        out["added_seeds"] = list(range(before_n, after_n))  # the new seeds themselves (issue 60: "seeds": [2, 3]
        # read as the run's seeds where it meant "from 2 to 3 seeds")
    return out


def resolve_prompt_style(config: RunConfig, task: Task) -> PromptStyle:
    """The run's prompt style, before anything loads: as given, or (unset) BASE for a model known to have no chat
    template (the pre-trained Gemma 3 270M; :func:`has_chat_template`) when the task can be put as a few-shot
    prompt, else CHAT. A base prompt has no instruction, so prompt variants do not apply to it."""
    if config.prompt_style is None:
        known = has_chat_template(config.model) if config.backend in ("hf", "vllm") else True
        style = PromptStyle.BASE if known is False and task.has_base_prompt else PromptStyle.CHAT
    else:
        try:
            style = PromptStyle(config.prompt_style)
        except ValueError:
            raise ConfigError(f"--prompt-style must be one of {', '.join(PromptStyle)}, got {config.prompt_style!r}"
                              ) from None
    if style is PromptStyle.BASE:
        if not task.has_base_prompt:
            raise ConfigError(f"--prompt-style base: task {task.name!r} has its benchmark's own prompt; use chat")
        if len(config.variants()) != 1:
            raise ConfigError("--prompt-style base: a few-shot prompt has no instruction, so it has one variant; "
                              "drop --prompt-variants")
    return style


def machine_load() -> dict[str, Any]:
    """The machine's load when a run starts or stops (recorded in the manifest): a slow cell on a loaded machine
    then reads as the machine's state, not the strategy's cost."""
    out: dict[str, Any] = {"cpus": os.cpu_count()}
    try:
        out["loadavg_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not every platform has a load average
        out["loadavg_1_5_15"] = None
    return out


LOCK_FILE = ".formtax.lock"
HOLDER_FILE = ".formtax.lock.holder"


@contextlib.contextmanager
def run_lock(out_dir: Path) -> Iterator[None]:
    """Hold ``out_dir`` exclusively for one run (:mod:`filelock`); a second run is refused and told who holds
    it, instead of both appending every record (two runs into one ``--out`` used to duplicate every id)."""
    lock = filelock.FileLock(str(out_dir / LOCK_FILE), timeout=0)
    holder = out_dir / HOLDER_FILE
    try:
        lock.acquire()
    except filelock.Timeout:
        who = holder.read_text(encoding="utf-8").strip() if holder.is_file() else "another process"
        raise ConfigError(f"{out_dir} is in use by another formtax run ({who}); wait for it to finish or "
                          "use another --out") from None
    try:
        holder.write_text(f"pid {os.getpid()} on {socket.gethostname()} since "
                          f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\n", encoding="utf-8")
        yield
    finally:
        holder.unlink(missing_ok=True)
        lock.release()


def run(config: RunConfig, out_dir: Path, progress: Callable[[int, int], None] | None = None,
        backend: Backend | None = None) -> RunSummary:
    """Run (or resume) the grid of ``config`` into ``out_dir``; ``progress(done, total)`` after each batch.

    Bad settings are refused before anything is written; the directory is locked for the whole run."""
    out_dir = Path(out_dir)
    if config.batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {config.batch_size}")
    if config.limit is not None and config.limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {config.limit}")
    if config.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be at least 1, got {config.max_tokens}")
    if config.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {config.workers}")
    if config.seeds < 1:
        raise ConfigError(f"--seeds must be at least 1, got {config.seeds}")
    if not config.strategies:
        raise ConfigError("no strategies given")
    for spec in config.strategies:  # an unknown strategy is refused before the directory exists (issue 60)
        parse_strategy_spec(spec)
    if config.backend in ("hf", "vllm"):
        check_model_name(config.model)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file, not a run directory")
    created = not out_dir.exists()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out_dir}: cannot create the run directory ({e.strerror or e})") from None
    if not os.access(out_dir, os.W_OK):
        raise ConfigError(f"--out {out_dir}: the run directory is not writable")
    try:
        with run_lock(out_dir):
            return _run(config, out_dir, progress, backend)
    except FormtaxError:
        # a run refused before it wrote anything leaves no directory that holds only its lock (issue 60)
        if created and out_dir.is_dir() and {f.name for f in out_dir.iterdir()} <= {LOCK_FILE}:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise


def run_closing(config: RunConfig, loaded: Manifest | None, backend: Backend | None = None) -> bool:
    """Closing mode for this session of a run: as given; else a resumed run's own (its manifest says what it ran
    with); else closing's default for the backend (the one given, else the named one's class), on wherever formtax
    steps the model, as on every other route (:func:`formtax.api.closing_default`). Settled before the model
    loads, so the run's identity names it."""
    if config.closing is not None:
        return config.closing
    if loaded is not None:
        return bool(loaded.run_config().closing)
    return closing_default(backend.capabilities if backend is not None else backend_capabilities(config.backend))


def _run(config: RunConfig, out_dir: Path, progress: Callable[[int, int], None] | None,
         backend: Backend | None) -> RunSummary:
    t_start = time.perf_counter()
    specs = [parse_strategy_spec(s) for s in config.strategies]
    if not specs:
        raise ConfigError("no strategies given")
    if len({s.spec for s in specs}) != len(specs):
        raise ConfigError(f"duplicate strategies in {config.strategies}")
    if config.seeds < 1:
        raise ConfigError("--seeds must be at least 1")
    if config.seeding not in SEEDINGS:
        raise ConfigError(f"--seeding must be one of {', '.join(SEEDINGS)}, got {config.seeding!r}")
    task = get_task(config.task)
    if isinstance(task, ConfigurableTask):
        if config.limit is not None and getattr(task, "samples_own_items", True):
            raise ConfigError(f"task {task.name!r} samples its own items (see its options); "
                              "--limit does not apply")
        replacement = task.configure(config.task_options)
        if isinstance(replacement, Task):
            task = replacement
    elif config.task_options:
        raise ConfigError(f"task {task.name!r} takes no task options (got {sorted(config.task_options)})")
    needs_data = (task._needs_data() and bool(task.data_files(Path(".")))) or config.data_dir is not None
    data_dir = resolve_data_dir(Path(config.data_dir) if config.data_dir else None) if needs_data else None
    style = resolve_prompt_style(config, task)
    config = replace(config, prompt_style=style.value)
    items = sample_items(task.load(data_dir), config.limit, config.item_seed)
    specs = config.strategy_specs(task)
    if len({s.spec for s in specs}) != len(specs):
        raise ConfigError(f"{config.strategies}: two of these run in the same answer form (--prompt-variants paper "
                          "gives InWriting and NL-to-Format the JSON form; a FEM strategy gives free and constrained "
                          "its key phrase), so they are the same strategy; write :plain for the answer line")
    planned = plan_grid(task, items, specs, lambda s: config.variants(s.name), list(range(config.seeds)),
                        config.shots, style=style, system_prompt=config.system_prompt)
    if config.reasoning_tokens is not None and config.reasoning_tokens < 1:
        raise ConfigError(f"--reasoning-tokens must be at least 1, got {config.reasoning_tokens}")
    check_equal_reasoning(task, planned, config)
    one_prompt = bool(getattr(task, "same_prompt_all_formats", False)) or style is PromptStyle.BASE
    check_prompt_identity(planned, lambda m: repr(m), across_formats=one_prompt)

    out_dir.mkdir(parents=True, exist_ok=True)
    loaded = load_manifest(out_dir)  # any earlier layout, migrated (runner/manifest.py)
    manifest = None if loaded is None else json.loads(loaded.model_dump_json())
    config = replace(config, closing=run_closing(config, loaded, backend))
    identity = config.identity()  # before --model-defaults is resolved: a resumed run names the same request
    extension: dict[str, Any] | None = None
    if manifest is not None and manifest.get("config_identity") != identity:
        old = manifest.get("config_identity") or {}
        extension = grid_extension(old, identity)
        if extension is None:
            diff = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
            raise ConfigError(f"{out_dir} holds a run with another configuration (differs in: {', '.join(diff)}); "
                              "only adding strategies or seeds extends a run; use a new --out directory")
    adopted = read_records(out_dir / RECORDS)
    run_hash = identity_hash(identity)
    try:
        check_adopted(adopted, planned, task, config, out_dir / RECORDS, run_hash)
    except DataError as e:
        if extension is None or "max_tokens" not in str(e):
            raise
        raise ConfigError(f"extending {out_dir} with {extension} would change the token budget of requests it "
                          f"already ran ({e}); with --reasoning-tokens the budget does not depend on the grid"
                          ) from None
    done_ids = {r.request_id for r in adopted}
    pending = [p for p in planned if p.request_id not in done_ids]
    files = task.data_files(data_dir if data_dir is not None else Path("."))
    file_hashes = {str(f): sha256_file(f) for f in files}
    if manifest is not None and manifest.get("data_files", file_hashes) != file_hashes:
        changed = sorted(k for k in set(manifest["data_files"]) | set(file_hashes)
                         if manifest["data_files"].get(k) != file_hashes.get(k))
        raise ConfigError(f"{out_dir}: data files changed since the run began ({', '.join(changed)}); "
                          "use a new --out directory")
    hypotheses = _hypotheses_lock(config, manifest, bool(done_ids), out_dir)
    summary = RunSummary(planned=len(planned), skipped=len(planned) - len(pending), out_dir=str(out_dir))

    samples = [next(p for p in planned if p.spec == s) for s in specs]
    pool = None
    Sampling(config.temperature, config.top_p, config.top_k, config.min_p)  # bad settings: refused before loading
    thinking_flag(config.thinking)
    if (config.extractor_model or config.extractor_backend) and not any(s.name == "nl2format" for s in specs):
        raise ConfigError("--extractor-model applies to nl2format, which the grid does not hold")
    extractor: Backend | None = None
    if config.model_defaults and backend is None and (config.workers > 1 or config.ray_address):
        raise ConfigError("--model-defaults is resolved in the driver's backend: run it without --workers")
    if backend is None and (config.workers > 1 or config.ray_address):
        from formtax.runner.parallel import WorkerPool

        pool = WorkerPool(config, task, samples)  # each worker loads its backend and checks every strategy
        provenance = pool.provenance
    else:
        if backend is None:
            backend = load_backend(config.backend, config.model, device=config.device, dtype=config.dtype,
                                   **config.backend_options)
        if config.thinking is not None:
            backend.tokenizer.set_thinking(thinking_flag(config.thinking))
        if config.model_defaults:  # the model's own settings replace the four (recorded in the manifest)
            from formtax.api import resolve_sampling

            s = resolve_sampling(backend, Sampling(), True)
            config = replace(config, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p)
        extractor = load_extractor(config)
        for sample in samples:  # refuse a strategy the backend cannot run, before any request
            strategy_for(sample, extractor).check(backend, [request_for(task, sample, config)])
            sample.checked = True  # its chunk does not check it again (one request, checked once)
        provenance = backend_provenance(backend)
        if extractor is not None:
            provenance["extractor"] = backend_provenance(extractor)

    manifest = manifest or {
        "schema_version": MANIFEST_VERSION, "formtax_version": __version__, "git": git_state(), "packages": package_versions(),
        "config": asdict(config), "config_identity": identity, "backend": provenance,
        "data_files": file_hashes, "items": [it.id for it in items],
        "seeds": list(range(config.seeds)), "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "resumptions": [],
        **({"hypotheses": hypotheses} if hypotheses else {}),
        **({"task_notes": notes} if (notes := task.notes()) else {}),
    }
    if extension is not None:  # the grid grows: the manifest now describes the larger grid and says when it grew
        manifest.setdefault("extensions", []).append({"at": time.strftime("%Y-%m-%dT%H:%M:%S"), **extension})
        manifest["config"], manifest["config_identity"] = asdict(config), identity
        manifest["seeds"] = list(range(config.seeds))
    manifest["status"] = "running"
    manifest["resumptions"].append({"at": time.strftime("%Y-%m-%dT%H:%M:%S"), "pending": len(pending),
                                    "batch_size": config.batch_size, "device": config.device,
                                    "machine": machine_load(), "planned": len(planned),
                                    "planned_by": planned_by(planned)})
    save_manifest(out_dir, manifest)

    n_done = summary.skipped
    if progress:
        progress(n_done, len(planned))
    chunks = [todo[k : k + config.batch_size] for s in specs for todo in [[p for p in pending if p.spec == s]]
              for k in range(0, len(todo), config.batch_size)]
    try:
        with RecordWriter(out_dir / RECORDS) as writer:
            if pool is not None:
                done_chunks: Iterable[tuple[Sequence[Planned], list[Record]]] = pool.run(chunks)
            else:
                assert backend is not None
                local = backend
                done_chunks = ((c, [rec for _, rec, _ in execute_chunk(local, task, c, config, extractor)])
                               for c in chunks)
            for chunk, records in done_chunks:  # one writer: the driver appends each finished chunk at once
                for rec in records:
                    rec.run_identity = run_hash
                    writer.append(rec)
                    summary.done += 1
                    summary.errors += rec.error is not None
                    summary.by_strategy[rec.strategy] = summary.by_strategy.get(rec.strategy, 0) + 1
                n_done += len(chunk)
                if progress:
                    progress(n_done, len(planned))
        manifest["status"] = "complete"
    except KeyboardInterrupt:
        manifest["status"] = "interrupted"
        raise
    except ConnectionError as e:  # a server gone (after its retries): stop cleanly, keep every record, resume later
        manifest["status"] = "failed"
        raise FormtaxError(f"{e}; the records written so far are kept, re-run the same command to resume") from e
    except FormtaxError:
        if pool is not None:
            manifest["status"] = "failed"
        raise
    finally:
        if pool is not None:
            pool.close()
        manifest["ended"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        manifest["resumptions"][-1]["machine_at_end"] = machine_load()
        save_manifest(out_dir, manifest)
    summary.wall_s = time.perf_counter() - t_start
    return summary


def planned_by(planned: Sequence[Planned]) -> dict[str, dict[str, int]]:
    """The grid's requests per strategy (as recorded) and seed: what an incomplete run's findings count against
    (report/findings.py); seeds as strings, JSON's keys."""
    out: dict[str, dict[str, int]] = {}
    for p in planned:
        by_seed = out.setdefault(p.spec.spec, {})
        by_seed[str(p.seed)] = by_seed.get(str(p.seed), 0) + 1
    return out


def _hypotheses_lock(config: RunConfig, manifest: dict[str, Any] | None, has_records: bool, out_dir: Path
                     ) -> dict[str, Any] | None:
    """The manifest's pre-registration entry for a new run, after refusing what would break the lock: a
    hypotheses file registered after records exist, or one that changed since it was registered."""
    if config.hypotheses is None:
        return None
    path = Path(config.hypotheses)
    if not path.is_file():
        raise ConfigError(f"hypotheses file not found: {path}")
    text = path.read_text(encoding="utf-8")
    entry = {"path": str(path.resolve()), "sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text,
             "registered_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if manifest is None:
        if has_records:
            raise ConfigError(f"{out_dir} already holds records: a hypotheses file must be registered "
                              "before any")
        return entry
    registered = manifest.get("hypotheses") or {}
    if registered.get("sha256") != entry["sha256"]:
        raise ConfigError(f"{path} changed since it was registered for {out_dir} "
                          f"(sha256 {registered.get('sha256')}, now {entry['sha256']}); the pre-registration "
                          "is locked")
    return None


def check_equal_reasoning(task: Task, planned: Sequence[Planned], config: RunConfig) -> None:
    """Refuse a grid whose constraint levels of one strategy would reason under different budgets."""
    seen: dict[tuple[str, str, str, int, bool], tuple[int, str]] = {}
    for p in planned:
        b = planned_budget(task, p, config)
        if "reasoning_tokens" not in b:
            continue
        key = (p.spec.name, p.item.id, p.prompt_variant, p.seed, p.spec.rc)
        first = seen.setdefault(key, (b["reasoning_tokens"], p.spec.spec))
        if first[0] != b["reasoning_tokens"]:
            raise ConfigError(f"{first[1]} would reason under {first[0]} tokens but {p.spec.spec} under "
                              f"{b['reasoning_tokens']} (item {p.item.id}); the levels of a strategy must share "
                              "one reasoning budget (--reasoning-tokens)")


def check_adopted(records: Sequence[Record], planned: Sequence[Planned], task: Task, config: RunConfig,
                  path: Path, run_hash: str | None = None) -> None:
    """Resume adopts only records this run would have written: each request once, each id one this grid plans,
    with the planned request's item, strategy, variant, seed, shots and token budget, written under this run's
    settings (``run_hash``: a record's ``run_identity``; records made before it existed have none). A duplicated
    line, an edited
    id or a record left by other settings (e.g. after a deleted manifest) is a DataError naming the line, instead
    of an answer silently counted for a request it did not answer."""
    by_id = {p.request_id: p for p in planned}
    seen: dict[str, int] = {}
    for n, rec in enumerate(records, start=1):
        where = f"{path} record {n} (request {rec.request_id})"
        if rec.request_id in seen:
            raise DataError(f"{where}: the same request already holds record {seen[rec.request_id]}; remove the "
                            "duplicate line before resuming")
        seen[rec.request_id] = n
        p = by_id.get(rec.request_id)
        if p is None:
            raise DataError(f"{where}: this run plans no such request (an edited id, or a record of another grid); "
                            "use a new --out directory")
        got = (rec.task, rec.item_id, rec.strategy, rec.prompt_variant, rec.seed, rec.shots)
        want = (p.task, p.item.id, p.spec.spec, p.prompt_variant, p.seed, p.shots)
        if got != want:
            raise DataError(f"{where}: holds {got}, but the id names {want}; the record was edited")
        if run_hash is not None and rec.run_identity and rec.run_identity != run_hash:
            raise DataError(f"{where}: written under other run settings (model, sampling, budgets or task options "
                            "differ from this run's); use a new --out directory")
        budget = planned_budget(task, p, config)["max_tokens"]
        if rec.budget.get("max_tokens", budget) != budget:
            raise DataError(f"{where}: written with max_tokens {rec.budget['max_tokens']}, this run plans {budget}; "
                            "use a new --out directory")


