"""Exact truths of a run grid on a planted world: per request the exact distribution of the *scored record*.

Each planned request of the grid (the runner's own planning, so prompts and constraints are the lab's) gets its
exact output distribution (:mod:`formtax.planted.exact`); each output is turned into the record the lab would
write (``runner.make_record``: the same parsers and scorers), and what the report reads from it is kept: strict
and lenient score, strict parse, whether it is scored, the masked mass and the suffix t*. From these come the
population truths that the report estimates: accuracies, parse rates, paired differences, paper 003's gains and
paper 002's deltas (:func:`population_truths`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from formtax.constraints.spec import Constraint
from formtax.decoding.plan import ERROR_FINISHES
from formtax.errors import ConfigError
from formtax.planted.backend import PlantedBackend
from formtax.planted.exact import Distribution, Kind, Outcome, Semantics, distribution, suffix_distribution
from formtax.report.load import format_ok
from formtax.runner.config import RunConfig
from formtax.runner.execute import make_record, request_for
from formtax.runner.grid import Planned, parse_strategy_spec, plan_grid
from formtax.strategies.base import Request, Result, finish_error
from formtax.strategies.reserve import answer_reserve
from formtax.tasks import Task, sample_items

SUFFIX_RULES = {"suffix-pipeline": "pipeline", "suffix-last": "last", "suffix-min": "min", "suffix-beam": "last"}
FEM = ("decog", "ctrlg")
SUPPORTED = {"free", "short", "constrained", "json", "inwriting", "nl2format", *SUFFIX_RULES, *FEM}
UNRESOLVED_LIMIT = 1e-6


@dataclass(frozen=True)
class Scored:
    """What the report reads from one record, with the record's exact probability."""

    p: float
    strict: float
    lenient: float
    parse_ok: float
    scored: bool
    format_ok: float = 0.0  # paper 003's parse rate (report.load.format_ok)
    masked_mass: float | None = None
    t_star: int | None = None
    text: str = ""


@dataclass
class RequestTruth:
    planned: Planned
    outcomes: list[Scored]
    unresolved: float = 0.0

    def expect(self, name: str) -> float:
        """E[field | scored] for strict / lenient / parse_ok / format_ok (NaN if never scored)."""
        mass = sum(o.p for o in self.outcomes if o.scored)
        if mass <= 0.0:
            return math.nan
        return sum(o.p * getattr(o, name) for o in self.outcomes if o.scored) / mass

    @property
    def p_unscored(self) -> float:
        return sum(o.p for o in self.outcomes if not o.scored)


def _semantics_and_assemble(backend: PlantedBackend, strategy: str, req: Request) -> list[tuple[float, Result, dict[str, Any]]]:
    """The exact outputs of one request as the Results the strategy would return (before parsing)."""
    tok = backend.tokenizer
    prefix = tok.encode(req.reasoning_prefix) if req.reasoning_prefix else []
    model = backend.row_model(tok.prompt_ids(req.prompt))
    c = req.constraint
    out: list[tuple[float, Result, dict[str, Any]]] = []

    def result(o: Outcome, text: str, answer: str | None, finish: str) -> Result:
        r = Result(strategy=strategy, model=backend.model_id, text=text, answer_text=answer, finish_reason=finish,
                   masked_mass=o.masked_mass, stats=dict(o.stats))
        if finish in ERROR_FINISHES:
            r.error = finish_error(finish)
        return r

    if strategy in SUFFIX_RULES:
        assert c is not None
        from formtax.strategies.suffix import SuffixStrategy

        tau = float(req.options.get("tau", 0.0))
        rule = SUFFIX_RULES[strategy]
        if strategy == "suffix-beam":
            rule = str(req.options.get("rule", rule))
        sd = suffix_distribution(model, tok, c, prefix, req.max_tokens, SuffixStrategy.reserve(c), rule, tau,
                                 req.temperature)
        for o in sd.outcomes:
            res = result(o, tok.decode_text(o.tokens), tok.decode_text(o.phase_tokens("answer")), o.finish)
            out.append((o.p, res, {"t_star": o.stats["t_star"], "unresolved": sd.unresolved}))
        return out
    if strategy in FEM and req.constrain:
        return _fem_outputs(backend, strategy, req, model, prefix, result)
    if strategy == "nl2format":
        assert c is not None
        first = distribution(model, tok, Semantics(Kind.FREE, req.max_tokens, prefix), req.temperature)
        for o1 in first.outcomes:
            text = tok.decode_text(o1.tokens)
            conv = req.conversion(text) if req.conversion is not None else None
            if conv is None:
                raise ConfigError("nl2format needs the task's conversion prompt")
            m2 = backend.row_model(tok.prompt_ids(conv))
            # paper 003: the unconstrained second call is only prompted and its whole output parsed; the
            # constrained one is masked to the answer's grammar. Either way the answer is all it wrote.
            sem = (Semantics(Kind.CONSTRAINED, answer_reserve(c), grammar=c.grammar) if req.constrain
                   else Semantics(Kind.FREE, answer_reserve(c), free_phase="answer"))
            second = distribution(m2, tok, sem, req.temperature)
            for o2 in second.outcomes:
                res = result(o2, text, tok.decode_text(o2.tokens), o2.finish)
                res.error = (f"the extraction call ended with {o2.finish}"
                             if o2.finish in ("constraint-error", "length-incomplete") else None)
                out.append((o1.p * o2.p, res, {"unresolved": first.unresolved + second.unresolved}))
        return out
    effective: Constraint | None = c
    if strategy == "json" and c is not None:
        from formtax.strategies.basic import Json

        effective = Json().effective_constraint(req)  # the planted backend steps the policy: escapes allowed
    constrained = req.constrain and c is not None and strategy in ("constrained", "json", "inwriting")
    if strategy in ("free",) or (not constrained and strategy != "short"):
        phase = "reasoning" if strategy in ("free", "inwriting") else "answer"
        sem = Semantics(Kind.FREE, req.max_tokens, prefix, free_phase=phase)
    elif strategy == "short":
        sem = Semantics(Kind.SHORT, req.max_tokens, prefix, free_phase="answer")
    elif strategy == "inwriting":
        assert c is not None
        sem = Semantics(Kind.INWRITING, req.max_tokens, prefix, grammar=c.grammar,
                        preamble_budget=max(0, req.max_tokens - answer_reserve(c) - len(prefix)),
                        triggers=frozenset(tok.encode(t)[0] for t in req.triggers))
    else:
        assert effective is not None
        from formtax.constraints.jsonreason import JsonReasonAnswer
        from formtax.constraints.jsonstrings import caps_for

        caps = caps_for(effective, tok.engine, tok.n_logits) if isinstance(effective, JsonReasonAnswer) else None
        sem = Semantics(Kind.CONSTRAINED, req.max_tokens, prefix, grammar=effective.grammar, json_caps=caps)
    d: Distribution = distribution(model, tok, sem, req.temperature)
    for o in d.outcomes:
        text = tok.decode_text(o.tokens)
        answer: str | None
        if strategy == "short":
            answer = tok.decode_text(o.phase_tokens("answer")).split("\n", 1)[0]
        elif constrained:
            answer = tok.decode_text(o.phase_tokens("answer"))
        else:
            answer = None
        if strategy == "inwriting" and answer:  # the documented presentation (docs/ALGORITHMS.md section 1)
            before = tok.decode_text(o.phase_tokens("rc")) + tok.decode_text(o.phase_tokens("reasoning"))
            if before and text == before + answer and not before[-1].isspace() and not answer[0].isspace():
                text = f"{before}\n{answer}"
        out.append((o.p, result(o, text, answer, o.finish), {"unresolved": d.unresolved}))
    return out


def _fem_outputs(backend: PlantedBackend, strategy: str, req: Request, model: Any, prefix: list[int],
                 result: Callable[[Outcome, str, str | None, str], Result]) -> list[tuple[float, Result, dict[str, Any]]]:
    """Deco-G / Ctrl-G: the strategy's settings and format DFA (the language), the rest from the specification."""
    from formtax.fem.dfa import FormatSpec, token_dfa, vocab_for
    from formtax.planted.exact_fem import FemSpec, fem_answer, fem_distribution
    from formtax.strategies.base import get_strategy
    from formtax.strategies.decog import FemStrategy, answer_template

    tok = backend.tokenizer
    strat = get_strategy(strategy)
    assert isinstance(strat, FemStrategy)
    s = strat.settings(req)
    dfa = token_dfa(strat.format_spec(req, s), vocab_for(tok))
    top_k = s.top_k if s.top_k is not None and s.top_k < s.artifact.h else None
    spec = FemSpec(dfa, s.artifact.hmm, tok.eos_ids, req.max_tokens, s.gamma, top_k, prefix)
    d = fem_distribution(model, spec, req.temperature)
    template = answer_template(req.constraint)
    n_lines = 1 + sum(p.count("\n") for p in template.parts if isinstance(p, str))
    pattern = (FormatSpec(template, prefix="none", suffix="none", leading_space=False).py_regex()
               if s.placement == "anywhere" else None)
    out = []
    for o in d.outcomes:
        text = tok.decode_text(o.tokens)
        body = tok.decode_text([t for t in o.tokens if t not in tok.eos_ids])
        answer = fem_answer(body, n_lines, s.leading_space, pattern) if o.finish not in ERROR_FINISHES else None
        out.append((o.p, result(o, text, answer, o.finish), {"unresolved": d.unresolved}))
    return out


def request_truth(backend: PlantedBackend, task: Task, p: Planned, config: RunConfig) -> RequestTruth:
    name = p.spec.name
    if name not in SUPPORTED:
        raise ConfigError(f"no exact truth for strategy {name!r} (covered: {', '.join(sorted(SUPPORTED))})")
    req = request_for(task, p, config)
    if req.top_p < 1.0 or req.top_k > 0 or req.min_p > 0.0:
        raise ConfigError("no exact truth with top_p / top_k / min_p: the enumerator follows temperature sampling "
                          "only")
    prompt_text = backend.tokenizer.prompt_text(p.messages)
    scored: list[Scored] = []
    unresolved = total = 0.0
    if backend.world.item(p.item.id).meta.get("fail"):  # the backend raises for this item: an error record
        return RequestTruth(p, [Scored(1.0, 0.0, 0.0, 0.0, False)], 0.0)
    for q, res, extra in _semantics_and_assemble(backend, name, req):
        unresolved = max(unresolved, float(extra.get("unresolved", 0.0)))
        total += q
        rec = make_record(task, p, res, prompt_text, 1, backend.model_id, error=None)
        strict = rec.parses.get("strict")
        scored.append(Scored(
            p=q, strict=float(rec.scores.get("strict", False)), lenient=float(rec.scores.get("lenient", False)),
            parse_ok=float(strict is not None and strict.status == "ok"), scored=rec.error is None,
            format_ok=format_ok(strict) if strict is not None else 0.0,
            masked_mass=rec.masked_mass, t_star=extra.get("t_star"), text=res.text))
    return RequestTruth(p, scored, max(unresolved, 1.0 - total))  # nothing enumerated: nothing resolved


@dataclass
class GridTruth:
    """Exact truths of every planned request of a grid."""

    requests: list[RequestTruth]
    strategies: list[str]
    items: list[str]
    max_unresolved: float = 0.0
    by_key: dict[tuple[str, str, str, int], RequestTruth] = field(default_factory=dict)

    def cell(self, strategy: str) -> list[RequestTruth]:
        return [r for r in self.requests if r.planned.spec.spec == strategy]


def grid_truth(backend: PlantedBackend, task: Task, config: RunConfig) -> GridTruth:
    """The exact truth of every request ``formtax run`` would make for ``config`` (seeds collapse under greedy)."""
    specs = config.strategy_specs(task)
    items = sample_items(task.load(None), config.limit, config.item_seed)
    planned = plan_grid(task, items, specs, lambda s: config.variants(s.name), [0], config.shots)  # truths do not depend on seeds
    truths = [request_truth(backend, task, p, config) for p in planned]
    worst = max((t.unresolved for t in truths), default=0.0)
    g = GridTruth(truths, [s.spec for s in specs], [it.id for it in items], worst)
    for t in truths:
        g.by_key[(t.planned.spec.spec, t.planned.item.id, t.planned.prompt_variant, 0)] = t
    return g


# -- population truths ---------------------------------------------------------------------------------------

GAINS = (("format_gain", "fc", "none"), ("validity_gain", "vc", "fc"), ("reasoning_gain", "vc_rc", "vc"))


def _item_means(g: GridTruth, strategy: str, name: str) -> dict[str, float]:
    """Per item: the exact expectation of ``name`` averaged over prompt variants (NaN if ever unscored)."""
    acc: dict[str, list[float]] = {}
    for r in g.cell(strategy):
        v = r.expect(name) if r.p_unscored == 0.0 else math.nan
        acc.setdefault(r.planned.item.id, []).append(v)
    return {k: float(np.mean(v)) for k, v in acc.items()}


def population_truths(g: GridTruth, weights: dict[str, float] | None = None) -> dict[tuple[str, ...], float]:
    """The estimands of the report, exactly: keys like ``("accuracy", strategy, "acc_strict")``,
    ``("paired", a, b, "diff")``, ``("decomposition", base, "validity_gain")``. ``weights`` (item id -> weight)
    define the item population (default: every item of the grid equally). Items unscored in a cell are left out
    of that cell, as the report's complete-case rule does."""
    w = weights or {i: 1.0 for i in g.items}
    out: dict[tuple[str, ...], float] = {}

    def mean(values: dict[str, float], keep: set[str] | None = None) -> float:
        ks = [k for k, v in values.items() if not math.isnan(v) and (keep is None or k in keep) and w.get(k, 0) > 0]
        tot = sum(w[k] for k in ks)
        return math.nan if tot == 0 else sum(w[k] * values[k] for k in ks) / tot

    strict = {s: _item_means(g, s, "strict") for s in g.strategies}
    for s in g.strategies:
        out[("accuracy", s, "acc_strict")] = mean(strict[s])
        out[("accuracy", s, "acc_lenient")] = mean(_item_means(g, s, "lenient"))
        out[("accuracy", s, "parse_rate_strict")] = mean(_item_means(g, s, "parse_ok"))
        out[("accuracy", s, "parse_rate_format")] = mean(_item_means(g, s, "format_ok"))
    for a, b in [(a, b) for i, a in enumerate(sorted(g.strategies)) for b in sorted(g.strategies)[i + 1:]]:
        common = {k for k in strict[a] if not math.isnan(strict[a][k]) and not math.isnan(strict[b].get(k, math.nan))}
        out[("paired", a, b, "diff")] = mean(strict[a], common) - mean(strict[b], common)
    bases: dict[str, dict[str, str]] = {}
    for s in g.strategies:
        spec = parse_strategy_spec(s)
        key = {("none", False): "none", ("fc", False): "fc", ("vc", False): "vc", ("vc", True): "vc_rc"}.get(
            (spec.level, spec.rc))
        if key is not None:  # one decomposition per strategy and answer form, as the report's
            bases.setdefault(spec.family, {}).setdefault(key, s)
    for base, levels in bases.items():
        if len(levels) < 2:
            continue
        common = set.intersection(*({k for k, v in strict[s].items() if not math.isnan(v)} for s in levels.values()))
        acc = {lv: mean(strict[s], common) for lv, s in levels.items()}
        for gain, hi, lo in GAINS:
            if hi in acc and lo in acc:
                out[("decomposition", base, gain)] = acc[hi] - acc[lo]
        top = [lv for lv in ("fc", "vc", "vc_rc") if lv in acc]
        if "none" in acc and top:
            out[("decomposition", base, "total_gain")] = acc[top[-1]] - acc["none"]
    return out

