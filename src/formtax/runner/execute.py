"""Executing planned requests: the request of a planned grid entry, its strategy, one chunk run into records.

:func:`execute_chunk` is what a run does with each chunk, in this process or in a Ray worker (runner/parallel.py);
everything it needs is here, so the executors and the run import it and nothing imports them back.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from formtax.api import closing_applied
from formtax.backends import Backend, load_backend
from formtax.constraints.parse import parse_spec
from formtax.errors import ConfigError, FormtaxError
from formtax.records.schema import ParseRecord, Record
from formtax.records.store import sha256_file
from formtax.runner.config import SEEDINGS, RunConfig
from formtax.runner.grid import RC_PREFIX, Planned, parse_strategy_spec
from formtax.runner.reparse import read_output
from formtax.strategies.base import Request, Result, Strategy
from formtax.strategies.decog import parse_fem_spec
from formtax.strategies.options import options_model
from formtax.tasks import OutputFormat, Task
from formtax.tasks.base import ConstraintLevel

log = logging.getLogger(__name__)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _item_hash(p: Planned) -> str:
    it = p.item
    return _sha(repr((it.id, it.question, it.gold, it.choices)))


def backend_provenance(backend: Backend) -> dict[str, Any]:
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
    # Parse what the strategy presents as its answer (runner/reparse.py: verify reads it again the same way).
    parses, rec.scores = read_output(task, p.item, res.text, res.answer_text, p.output_format,
                                     p.spec.strategy.answer_alone, bool(res.stats.get("constraint_ignored")))
    rec.parses = {k: ParseRecord(status=v.status, value=v.value, raw=v.raw) for k, v in parses.items()}
    return rec


def planned_budget(task: Task, p: Planned, config: RunConfig) -> dict[str, int]:
    """The token budget of one planned request, kept on ``p.budget`` (and in its record).

    For a strategy with a separate reasoning phase (:meth:`Strategy.answer_overhead`) the reasoning budget R is
    the same at every constraint level (paper 003 compares levels at one ``max_preamble_tokens``): R is
    ``config.reasoning_tokens``, or else ``max_tokens`` minus the largest overhead among the strategy's levels in
    the grid for this item (FC's reserve is the larger; the unconstrained level's is VC's, which reads its answer).
    ``max_tokens`` is then R plus this level's own overhead. Ours: a forced RC prefix is reasoning text and
    counts inside R. Other strategies get ``max_tokens`` whole. With ``config.same_reasoning`` every strategy's
    reasoning budget is the same R (``reasoning_tokens``, else ``max_tokens``): a strategy without an answer phase
    writes reasoning and answer in R, the others get their answer's reserve on top (issue 60).
    """
    if p.budget is not None:
        return p.budget
    strategy = p.spec.strategy
    options = strategy_options(p, config)
    probe = Request(prompt=p.messages, constraint=p.constraint(), max_tokens=config.max_tokens, options=options)
    overhead = strategy.answer_overhead(probe) if probe.constraint is not None else None
    if config.same_reasoning:  # issue 60: one reasoning budget for every strategy of the grid
        reasoning = config.reasoning_tokens if config.reasoning_tokens is not None else config.max_tokens
        p.budget = ({"reasoning_tokens": reasoning, "max_tokens": reasoning} if overhead is None else
                    {"reasoning_tokens": reasoning, "answer_tokens": overhead, "max_tokens": reasoning + overhead})
        return p.budget
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
        if reasoning < 1 and config.reasoning_floor > 0:
            reasoning = config.reasoning_floor  # the defaults run every strategy a task lists
        if reasoning < 1:
            raise ConfigError(f"strategy {p.spec.spec!r}: --max-tokens {config.max_tokens} leaves no reasoning "
                              f"budget after the answer's {worst} tokens; raise it or pass --reasoning-tokens")
    p.budget = {"reasoning_tokens": reasoning, "answer_tokens": overhead, "max_tokens": reasoning + overhead}
    return p.budget


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


def request_for(task: Task, p: Planned, config: RunConfig) -> Request:
    """The strategy request of one planned grid entry (also what the calibration truths are computed for)."""
    if config.closing is None:
        raise ConfigError("the run's closing mode is not settled (runner/run.py's run_closing settles it)")
    budget = planned_budget(task, p, config)
    return Request(prompt=p.messages, constraint=p.constraint(), max_tokens=budget["max_tokens"],
                   closing=config.closing, reserve=budget.get("answer_tokens"),
                   seed=sampler_seed(p, config.seeding),
                   temperature=config.temperature, top_p=config.top_p, top_k=config.top_k, min_p=config.min_p,
                   reasoning_prefix=RC_PREFIX if p.spec.rc else None,
                   constrain=p.spec.level != "none", conversion=p.conversion(task),
                   options=strategy_options(p, config))


def strategy_options(p: Planned, config: RunConfig) -> dict[str, Any]:
    """The strategy-specific settings of one planned request (``Request.options``)."""
    options: dict[str, Any] = {}
    fields = options_model(p.spec.name).model_fields  # what the strategy's options model takes
    if config.fem and "fem" in fields:
        options["fem"] = config.fem
        # Deco-G's key phrase only has to appear: placed anywhere unless --fem says otherwise
        if (p.output_format == OutputFormat.REASON_KEYPHRASE
                and "placement" not in parse_fem_spec(config.fem, p.spec.name)[1]):
            options["placement"] = "anywhere"
    if "json_layout" in fields:
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


def execute_chunk(backend: Backend, task: Task, chunk: Sequence[Planned], config: RunConfig,
                  extractor: Backend | None = None) -> list[tuple[Planned, Record, str | None]]:
    """Run one chunk and make its records: the one execution step of a run, the same in this process and in a
    parallel worker (runner/parallel.py)."""
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
        requests = [request_for(task, p, config) for p in chunk]
        unchecked = [r for p, r in zip(chunk, requests, strict=True) if not p.checked]
        if unchecked:
            strategy.check(backend, unchecked)
        results = strategy.run(backend, requests, checked=True)
        for q, res in zip(requests, results, strict=True):  # whether closing ran, as every route's Result says
            if q.constraint is not None and q.constrain:
                res.stats.setdefault("closing", closing_applied(backend, strategy, q))
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
