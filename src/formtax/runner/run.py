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
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import filelock
import numpy as np

from formtax import __version__
from formtax.backends import Backend, load_backend
from formtax.backends.model_files import check_model_name, has_chat_template
from formtax.constraints.spec import parse_spec
from formtax.decoding.sampling import Sampling
from formtax.errors import ConfigError, DataError, FormtaxError
from formtax.parsing import ParseResult, parse_all
from formtax.records.schema import ParseRecord, Record, identity_hash
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
from formtax.strategies.base import Request, Result, Strategy
from formtax.strategies.decog import FEM_STRATEGIES, parse_fem_spec
from formtax.tasks import (
    Item,
    OutputFormat,
    PromptStyle,
    Task,
    get_task,
    parse_variant_id,
    resolve_data_dir,
    sample_items,
)
from formtax.tasks.base import ConstraintLevel

log = logging.getLogger(__name__)

# Options that change how fast a run goes, not what it computes: they may differ between resumptions.
NON_IDENTITY = ("batch_size", "device", "workers", "ray_address", "backend_options")


@runtime_checkable
class ConfigurableTask(Protocol):
    """A task that takes options of its own (e.g. metatool's ``pairs``, ``translations``). ``configure`` may
    return the task to use instead (the planted task returns the one of its world's answer kind). A task samples
    its own items (and refuses ``--limit``) unless it sets ``samples_own_items = False``."""

    def configure(self, options: Mapping[str, Any]) -> Task | None: ...


@runtime_checkable
class OwnParsing(Protocol):
    """A task whose benchmark defines how an output is read (e.g. metatool's mention rules): it returns the
    per-parser verdicts (at least ``strict`` and ``lenient``) that formtax's parsers would otherwise give."""

    def parse_output(self, text: str, item: Item, output_format: OutputFormat) -> dict[str, ParseResult]: ...


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
    # "chat" | "base" (a plain few-shot prompt, paper 000's pre-trained setting); None: base for a model known to
    # have no chat template (resolve_prompt_style), else chat. The resolved style is what the run records.
    prompt_style: str | None = None
    max_tokens: int = 256
    # paper 003's equal reasoning budget: the reasoning phase of every level of a strategy gets this many tokens,
    # the answer's reserve on top; None: max_tokens minus the largest reserve of the strategy's levels (FC, VC)
    reasoning_tokens: int | None = None
    batch_size: int = 8
    temperature: float = 0.0
    top_p: float = 1.0  # sampling filters (decoding/sampling.py)
    top_k: int = 0
    min_p: float = 0.0
    model_defaults: bool = False  # sample with the model's generation_config defaults (resolved at load)
    thinking: str | None = None  # "on" | "off": the chat template's enable_thinking (paper 003: off); None: as is
    extractor_model: str | None = None  # NL-to-Format's second call on this model (paper 003: a larger one)
    extractor_backend: str | None = None  # its engine (default: --backend)
    item_seed: int = 0
    data_dir: str | None = None
    task_options: dict[str, Any] = field(default_factory=dict)  # passed to a ConfigurableTask
    hypotheses: str | None = None  # pre-registration file, locked into the manifest
    workers: int = 1  # > 1: shard the chunks over this many Ray actors, one backend each (runner/parallel.py)
    ray_address: str | None = None  # join this Ray cluster instead of starting a local one
    backend_options: dict[str, Any] = field(default_factory=dict)  # e.g. server=URL, tensor_parallel_size=2
    fem: str | None = None  # decog / ctrlg: FEM artifact(s), FILE or NAME=FILE,... (strategies/decog.py)
    seeding: str = "request"  # how a request's sampler seed is made from its seed index: see sampler_seed
    json_layout: str = "flexible"  # the json strategy's layout (constraints/jsonreason.py): flexible | compact

    def identity(self) -> dict[str, Any]:
        d = asdict(self)
        for k in NON_IDENTITY:
            d.pop(k)
        # Unset new options are left out, so run directories made before they existed still resume.
        if not d["task_options"]:
            d.pop("task_options")
        if d["hypotheses"] is None:
            d.pop("hypotheses")
        if d["fem"] is None:
            d.pop("fem")
        if d["reasoning_tokens"] is None:
            d.pop("reasoning_tokens")
        if not any(parse_strategy_spec(s).name == "json" for s in self.strategies):
            d.pop("json_layout")  # a grid without the json strategy reads no layout
        if d["prompt_style"] in (None, PromptStyle.CHAT):
            d.pop("prompt_style")  # chat: the only style before base-model prompting existed
        if d["seeding"] == "index" or (self.temperature <= 0.0 and not self.model_defaults):
            d.pop("seeding")  # the rule before it existed; and greedy decoding reads no seed
        for key, default in (("top_p", 1.0), ("top_k", 0), ("min_p", 0.0), ("model_defaults", False),
                             ("thinking", None), ("extractor_model", None), ("extractor_backend", None)):
            if d[key] == default:
                d.pop(key)
        return d

    def variants(self, strategy: str | None = None) -> list[tuple[int, int]]:
        """The (task variant, format variant) pairs of ``strategy`` (a base strategy name; None: any)."""
        if self.prompt_variants == "paper":
            return paper_variants(self.task, strategy)
        if self.prompt_variants == "all":
            return [(t, f) for t in (1, 2, 3) for f in (1, 2, 3)]
        return [parse_variant_id(v.strip()) for v in self.prompt_variants.split(",") if v.strip()]


PAPER_PLANS = {"inwriting": (3, 3), "nl2format": (3, 3), "json": (3, 1)}
"""Paper 003's prompt plan (A.2): task x format variants per strategy; AIME uses 1 task x 3 format variants."""


def paper_variants(task: str, strategy: str | None) -> list[tuple[int, int]]:
    """``--prompt-variants paper``: exactly paper 003's plan for ``strategy`` on ``task`` (refused for strategies
    the paper does not run)."""
    if strategy is None:  # the union, for callers that ask for every variant in the grid
        return sorted({v for name in PAPER_PLANS for v in paper_variants(task, name)})
    if strategy not in PAPER_PLANS:
        raise ConfigError(f"--prompt-variants paper: paper 003 runs {', '.join(sorted(PAPER_PLANS))}, not "
                          f"{strategy!r}; give the variants explicitly (e.g. t1f1)")
    n_task, n_format = (1, 3) if task == "aime" else PAPER_PLANS[strategy]
    return [(t, f) for t in range(1, n_task + 1) for f in range(1, n_format + 1)]


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
        out["seeds"] = [before_n, after_n]
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
        base_strategy=p.spec.family, level=p.spec.level, rc=p.spec.rc, output_format=p.output_format,
        prompt_format=p.prompt_format if p.prompt_format not in ("", p.output_format) else None,
        prompt_variant=p.prompt_variant, seed=p.seed, shots=p.shots, prompt_style=p.prompt_style.value, model=model,
        batch_size=batch_size,
        prompt_hash=_sha(prompt_text), prompt=prompt_text, gold=p.item.gold, answer_spec=p.answer, error=error,
        budget=dict(p.budget or {}),
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
    fmt = OutputFormat(p.output_format)
    if isinstance(task, OwnParsing):
        parses = task.parse_output(text, p.item, fmt)
    else:
        parses = parse_all(text, task, p.item, fmt)
    if res.stats.get("constraint_ignored"):  # an engine broke the constraint: its text is never scored as parsed
        parses = {k: ParseResult("invalid", None, v.raw) for k, v in parses.items()}
    rec.parses = {k: ParseRecord(status=v.status, value=v.value, raw=v.raw) for k, v in parses.items()}
    rec.scores = score_all(task, p.item, parses)
    return rec


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
    if config.backend in ("hf", "vllm"):
        check_model_name(config.model)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file, not a run directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out_dir}: cannot create the run directory ({e.strerror or e})") from None
    if not os.access(out_dir, os.W_OK):
        raise ConfigError(f"--out {out_dir}: the run directory is not writable")
    with run_lock(out_dir):
        return _run(config, out_dir, progress, backend)


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
    planned = plan_grid(task, items, specs, lambda s: config.variants(s.name), list(range(config.seeds)),
                        config.shots, style=style)
    if config.reasoning_tokens is not None and config.reasoning_tokens < 1:
        raise ConfigError(f"--reasoning-tokens must be at least 1, got {config.reasoning_tokens}")
    check_equal_reasoning(task, planned, config)
    one_prompt = bool(getattr(task, "same_prompt_all_formats", False)) or style is PromptStyle.BASE
    check_prompt_identity(planned, lambda m: repr(m), across_formats=one_prompt)

    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(out_dir)
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
        provenance = _backend_provenance(backend)
        if extractor is not None:
            provenance["extractor"] = _backend_provenance(extractor)

    manifest = manifest or {
        "formtax_version": __version__, "git": git_state(), "packages": package_versions(),
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
                                    "machine": machine_load()})
    write_manifest(out_dir, manifest)

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
                done_chunks = ((c, [rec for _, rec, _ in chunk_records(local, task, c, config, extractor)])
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
        write_manifest(out_dir, manifest)
    summary.wall_s = time.perf_counter() - t_start
    return summary


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
    entry = {"path": str(path.resolve()), "sha256": _sha(text), "text": text,
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


def thinking_flag(value: str | None) -> bool | None:
    """``--thinking on|off`` as the template's ``enable_thinking`` (None: the template's default)."""
    if value is None:
        return None
    if value not in ("on", "off"):
        raise ConfigError(f"--thinking must be on or off, got {value!r}")
    return value == "on"


def planned_budget(task: Task, p: Planned, config: RunConfig) -> dict[str, int]:
    """The token budget of one planned request, kept on ``p.budget`` (and in its record).

    For a strategy with a separate reasoning phase (:meth:`Strategy.answer_overhead`) the reasoning budget R is
    the same at every constraint level (paper 003 compares levels at one ``max_preamble_tokens``): R is
    ``config.reasoning_tokens``, or else ``max_tokens`` minus the largest overhead among the strategy's levels in
    the grid for this item (FC's reserve is the larger; the unconstrained level's is VC's, which reads its answer).
    ``max_tokens`` is then R plus this level's own overhead. Ours: a forced RC prefix is reasoning text and
    counts inside R. Other strategies get ``max_tokens`` whole.
    """
    if p.budget is not None:
        return p.budget
    strategy = p.spec.strategy
    options = strategy_options(p, config)
    probe = Request(prompt=p.messages, constraint=p.constraint(), max_tokens=config.max_tokens, options=options)
    overhead = strategy.answer_overhead(probe) if probe.constraint is not None else None
    if overhead is None:
        p.budget = {"max_tokens": config.max_tokens}
        return p.budget
    if config.reasoning_tokens is not None:
        reasoning = config.reasoning_tokens
    else:
        # the unconstrained level reads its answer with VC's constraint; the answer forms of a strategy (the line,
        # paper 003's JSON object) share its reasoning budget too, so that they compare on equal reasoning
        levels: set[tuple[ConstraintLevel, OutputFormat]] = {
            ("fc" if s.level == "fc" else "vc", s.output_format(task))
            for s in map(parse_strategy_spec, config.strategies) if s.name == p.spec.name}
        worst = max(strategy.answer_overhead(Request(prompt=p.messages, constraint=parse_spec(
            task.answer_spec(level, p.item, fmt)), options=options)) or 0 for level, fmt in sorted(levels))
        reasoning = config.max_tokens - worst
        if reasoning < 1:
            raise ConfigError(f"strategy {p.spec.spec!r}: --max-tokens {config.max_tokens} leaves no reasoning "
                              f"budget after the answer's {worst} tokens; raise it or pass --reasoning-tokens")
    p.budget = {"reasoning_tokens": reasoning, "answer_tokens": overhead, "max_tokens": reasoning + overhead}
    return p.budget


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


SEEDINGS = ("request", "index")


def sampler_seed(p: Planned, seeding: str = "request") -> int:
    """The seed of one request's sampler.

    ``request`` (the default, our choice): a seed of its own per (task, item, strategy, prompt variant, seed
    index), derived by ``numpy.random.SeedSequence``, so every request is an independent draw. That is the model
    the report's statistics and the calibration suite's exact truths assume (items independent, seeds
    independent within an item). ``index`` (formtax before 0.x, and the common practice of one ``--seed`` for a
    whole benchmark): the seed index itself, so every item and strategy with seed k reads the same uniform
    numbers. Those common random numbers couple the items (an item-level bootstrap then misjudges the variance)
    and make joint statistics such as D_paired depend on the sampler's internals; kept to reproduce older runs.
    """
    if seeding == "index":
        return int(p.seed)
    if seeding != "request":
        raise ConfigError(f"unknown seeding {seeding!r}; use one of {', '.join(SEEDINGS)}")
    key = "\x00".join((p.task, p.item.id, p.spec.spec, p.prompt_variant)).encode("utf-8")
    words = [int(b) for b in hashlib.sha256(key).digest()[:16]]
    return int(np.random.SeedSequence([int(p.seed), *words]).generate_state(1, np.uint64)[0] >> 1)


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


def request_for(task: Task, p: Planned, config: RunConfig) -> Request:
    """The strategy request of one planned grid entry (also what the calibration truths are computed for)."""
    max_tokens = planned_budget(task, p, config)["max_tokens"]
    return Request(prompt=p.messages, constraint=p.constraint(), max_tokens=max_tokens,
                   seed=sampler_seed(p, config.seeding),
                   temperature=config.temperature, top_p=config.top_p, top_k=config.top_k, min_p=config.min_p,
                   reasoning_prefix=RC_PREFIX if p.spec.rc else None,
                   constrain=p.spec.level != "none", conversion=p.conversion(task),
                   options=strategy_options(p, config))


def strategy_options(p: Planned, config: RunConfig) -> dict[str, Any]:
    """The strategy-specific settings of one planned request (``Request.options``)."""
    options: dict[str, Any] = {}
    if config.fem and p.spec.name in FEM_STRATEGIES:
        options["fem"] = config.fem
        # Deco-G's key phrase only has to appear: placed anywhere unless --fem says otherwise
        if (p.output_format == OutputFormat.REASON_KEYPHRASE
                and "placement" not in parse_fem_spec(config.fem, p.spec.name)[1]):
            options["placement"] = "anywhere"
    if p.spec.name == "json":
        options["json_layout"] = config.json_layout
    return options


def load_extractor(config: RunConfig) -> Backend | None:
    """NL-to-Format's extractor backend (``--extractor-model``), or None to extract with the main model."""
    if config.extractor_model is None and config.extractor_backend is None:
        return None
    return load_backend(config.extractor_backend or config.backend, config.extractor_model, device=config.device,
                        dtype=config.dtype)


def strategy_for(p: Planned, extractor: Backend | None) -> Strategy:
    """The strategy object of a planned entry: NL-to-Format with the run's extractor when there is one."""
    if extractor is not None and p.spec.name == "nl2format":
        from formtax.strategies.nl2format import NL2Format

        return NL2Format(extractor=extractor)
    return p.spec.strategy


def chunk_records(backend: Backend, task: Task, chunk: Sequence[Planned], config: RunConfig,
                  extractor: Backend | None = None) -> list[tuple[Planned, Record, str | None]]:
    """Run one chunk and make its records (the same in one process and in a parallel worker)."""
    render = backend.tokenizer.prompt_text
    cpu0 = time.process_time()
    done = _run_chunk(backend, task, chunk, config, extractor)
    cpu = time.process_time() - cpu0  # this process's CPU seconds (all threads) for the batch, beside wall time
    out = []
    for p, res, err in done:
        rec = make_record(task, p, res, render(p.messages), len(chunk), backend.model_id, err)
        if res is not None:
            rec.timings = {**rec.timings, "batch_cpu_s": cpu}
        out.append((p, rec, err))
    return out


def _run_chunk(backend: Backend, task: Task, chunk: Sequence[Planned], config: RunConfig,
               extractor: Backend | None = None) -> list[tuple[Planned, Result | None, str | None]]:
    """Run one batch; if the batch fails, run its requests one by one so one bad request costs only itself."""
    strategy = strategy_for(chunk[0], extractor)
    try:
        results = strategy.run(backend, [request_for(task, p, config) for p in chunk])
        return [(p, r, None) for p, r in zip(chunk, results, strict=True)]
    except (FormtaxError, RuntimeError, ValueError) as e:
        if len(chunk) == 1:
            log.warning("request %s failed: %s", chunk[0].request_id, e)
            return [(chunk[0], None, f"{type(e).__name__}: {e}")]
        log.warning("a batch failed (%s); retrying its requests one by one", e)
        out: list[tuple[Planned, Result | None, str | None]] = []
        for p in chunk:
            out.extend(_run_chunk(backend, task, [p], config, extractor))
        return out
