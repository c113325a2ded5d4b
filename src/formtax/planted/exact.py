"""Exact output distributions of the strategies on a planted world, computed without the decode loop.

For one request (a prompt, a strategy's semantics, its constraint, budget and temperature) this enumerates the
world's finite continuation tree under the strategy's masks and renormalisation, following the written
specification (docs/ALGORITHMS.md sections 1, 2, 4, 5, 6) rather than formtax's policies, so that a bug in the loop or a
policy shows up as a difference between the lab's estimate and this truth. What is shared with the lab is only the
model (:class:`~formtax.planted.backend.RowModel`'s logits) and the constraint's language (the engine's allowed
sets, which the oracle of every constrained output checks separately).

- Greedy (temperature 0): the single path of masked argmaxes (ties to the lowest token id, as ``torch.argmax``).
- Sampling at temperature T: every on-path branch with its exact probability ``softmax(logits / T)`` restricted to
  the allowed set and renormalised. The floor's off-path branches cannot be enumerated (a 49k-way tree); their
  total probability is returned as ``unresolved``, a hard bound on the truth's error (about ``floor`` per step),
  and a world that *leaves* its paths under sampling (every on-path token masked) makes it large: the caller
  refuses such a truth instead of reporting it.
- Suffix strategies: paper 000 decodes greedily; formtax also samples them (the free pass from the unmasked
  distribution, the completion under the mask), and the truth enumerates both passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import torch

from formtax.constraints.compile import Matcher, compile_grammar
from formtax.constraints.jsonstrings import StringCaps
from formtax.constraints.spec import Constraint
from formtax.decoding.engine import TokenizerInfo
from formtax.decoding.plan import Finish
from formtax.planted.backend import RowModel


class Kind(StrEnum):
    FREE = "free"
    SHORT = "short"
    CONSTRAINED = "constrained"
    INWRITING = "inwriting"


@dataclass
class Outcome:
    """One output of a request with its exact probability."""

    p: float
    tokens: list[int]
    phases: list[str]
    finish: str
    masked_mass: float | None = None
    stats: dict[str, Any] = field(default_factory=dict)

    def phase_tokens(self, *names: str) -> list[int]:
        return [t for t, ph in zip(self.tokens, self.phases, strict=True) if ph in names]


@dataclass
class Distribution:
    outcomes: list[Outcome]
    unresolved: float = 0.0  # probability of branches that could not be enumerated (see the module docstring)


@dataclass
class Semantics:
    """What one call does, written out: see docs/ALGORITHMS.md for each kind."""

    kind: Kind
    max_tokens: int
    prefix: list[int] = field(default_factory=list)  # RC: forced first tokens
    grammar: str | None = None  # CONSTRAINED / INWRITING: the answer grammar
    preamble_budget: int = 0  # INWRITING
    triggers: frozenset[int] = frozenset()  # INWRITING
    first_allowed: torch.Tensor | None = None  # the answer's first token is further restricted to this set
    answer_phase: str = "answer"
    free_phase: str = "reasoning"
    json_caps: StringCaps | None = None  # CONSTRAINED json: the policy-kept caps (constraints/jsonstrings.py)


@dataclass
class _State:
    p: float
    tokens: list[int]
    phases: list[str]
    matcher: Matcher | None
    switched: bool = False  # INWRITING: in the answer phase; CONSTRAINED: always
    first_answer: bool = True
    masked_mass: float | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    caps: StringCaps | None = None  # the json strategy's policy-kept string caps (constraints/jsonstrings.py)

    def extend(self, q: float, token: int, phase: str) -> _State:
        """A child state: this one after ``token`` (chosen with probability ``q``) in ``phase``."""
        c = self.fork(q)
        c.tokens.append(token)
        c.phases.append(phase)
        return c

    def fork(self, q: float) -> _State:
        return _State(self.p * q, list(self.tokens), list(self.phases),
                      self.matcher.copy() if self.matcher is not None else None, self.switched,
                      self.first_answer, self.masked_mass, dict(self.stats),
                      self.caps.copy() if self.caps is not None else None)


NEGLIGIBLE = 1e-13
"""Branches less likely than this are added to ``unresolved`` instead of enumerated (each floor-level switch)."""
SMALL_ALLOWED = 64
"""An allowed set this small is enumerated token by token (see ``_branches``)."""


def _argmax(values: np.ndarray, allowed: np.ndarray | None) -> int:
    if allowed is not None:
        values = np.where(allowed, values, -np.inf)
    return int(np.argmax(values))  # the first maximum, as torch.argmax


def _masked_mass(logits: np.ndarray, allowed: np.ndarray) -> float:
    x = logits.astype(np.float64)
    p = np.exp(x - x.max())
    p /= p.sum()
    return float(1.0 - p[allowed].sum())


def _branches(model: RowModel, node: int | None, logits: np.ndarray, allowed: np.ndarray | None,
              temperature: float) -> tuple[list[tuple[int, float]], float]:
    """The next tokens with their probabilities under the mask, and the mass that cannot be enumerated."""
    if temperature <= 0.0:
        return [(_argmax(logits, allowed), 1.0)], 0.0
    if allowed is not None and int(allowed.sum()) == 1:
        return [(int(np.flatnonzero(allowed)[0]), 1.0)], 0.0
    x = logits.astype(np.float64) / temperature
    if allowed is not None:
        x = np.where(allowed, x, -np.inf)
    x -= x.max()
    p = np.exp(x)
    p /= p.sum()
    if allowed is not None and int(allowed.sum()) <= SMALL_ALLOWED:
        # a small allowed set (digits and EOS inside an integer slot) is enumerated whole, so a mask that leaves
        # the world's paths (the floor's uniform branches) stays exact; only branches below NEGLIGIBLE are dropped
        on = [int(t) for t in np.flatnonzero(allowed)]
    else:
        on = [t for t in model.probs_at(node) if allowed is None or allowed[t]]
    out = [(t, float(p[t])) for t in on if p[t] >= NEGLIGIBLE]
    return out, max(0.0, 1.0 - sum(q for _, q in out))


def distribution(model: RowModel, tok: TokenizerInfo, sem: Semantics, temperature: float) -> Distribution:
    """Every output of one call and its probability (see the module docstring)."""
    compiled = compile_grammar(sem.grammar, tok.engine) if sem.grammar is not None else None
    eos = tok.eos_ids
    stop_ids = frozenset(eos | {tok.pad_id})
    newline = tok.newline_ids if sem.kind is Kind.SHORT else frozenset()
    start = _State(1.0, [], [], compiled.matcher(tok.n_logits) if compiled is not None else None,
                   switched=sem.kind is Kind.CONSTRAINED,
                   caps=sem.json_caps.copy() if sem.json_caps is not None else None)
    done: list[Outcome] = []
    unresolved = 0.0
    stack = [start]

    def finish(s: _State, reason: Finish) -> None:
        done.append(Outcome(s.p, s.tokens, s.phases, reason, s.masked_mass, s.stats))

    def budget_reason(s: _State) -> Finish:
        """Why a row that spent its budget ended (the RC prefix, then the inner part's own rule)."""
        if len(s.tokens) < len(sem.prefix) or sem.kind in (Kind.FREE, Kind.SHORT):
            return Finish.LENGTH
        if not s.switched:
            return Finish.LENGTH_INCOMPLETE
        assert s.matcher is not None
        return Finish.LENGTH if s.matcher.accepting else Finish.LENGTH_INCOMPLETE

    while stack:
        s = stack.pop()
        n = len(s.tokens)
        if n >= sem.max_tokens:
            finish(s, budget_reason(s))
            continue
        gen = s.tokens
        if n < len(sem.prefix):  # the reasoning constraint: forced tokens
            t = sem.prefix[n]
            s.tokens.append(t)
            s.phases.append("rc")  # not fed to the grammar: the forced prefix is not part of the answer
            stack.append(s)
            continue
        node = model.node(gen)
        logits = model.logits_at(node).numpy()
        if sem.kind is Kind.INWRITING and not s.switched:
            last = gen[-1] if len(gen) > len(sem.prefix) else None
            n_pre = n - len(sem.prefix)
            reason = None
            if last is not None and last in sem.triggers:
                reason = "trigger"
            elif n_pre >= sem.preamble_budget:
                reason = "budget"  # forced by the budget, whatever the model wanted there
            elif temperature > 0.0:
                # the sampled rule (section 4): a draw from the unmasked distribution; a stop token switches
                # (the answer is then drawn under the mask at this step), any other token is kept
                x = logits.astype(np.float64) / temperature
                p = np.exp(x - x.max())
                p /= p.sum()
                p_stop = float(p[sorted(stop_ids)].sum())
                on = [(t, float(p[t])) for t in model.probs_at(node) if t not in stop_ids and p[t] > 0.0]
                unresolved += s.p * max(0.0, 1.0 - p_stop - sum(q for _, q in on))
                stack.extend(s.extend(q, t, sem.free_phase) for t, q in on)
                c = s.fork(p_stop)
                if c.p < NEGLIGIBLE:  # a switch at a floor-level EOS: counted, not enumerated
                    unresolved += c.p
                    continue
                c.switched = True
                c.stats["switch_step"] = n
                c.stats["switch_reason"] = "eos"
                stack.append(c)  # popped again at this step, now in the answer phase
                continue
            elif _argmax(logits, None) in stop_ids:
                reason = "eos"
            if reason is None:
                allowed = np.ones(len(logits), dtype=bool)
                allowed[sorted(stop_ids)] = False
                branches, lost = _branches(model, node, logits, allowed, temperature)
                unresolved += s.p * lost
                stack.extend(s.extend(q, t, sem.free_phase) for t, q in branches)
                continue
            s.switched = True
            s.stats["switch_step"] = n
            s.stats["switch_reason"] = reason
        if sem.kind in (Kind.FREE, Kind.SHORT):
            branches, lost = _branches(model, node, logits, None, temperature)
            unresolved += s.p * lost
            for t, q in branches:
                c = s.extend(q, t, sem.free_phase)
                if t in eos:
                    finish(c, Finish.EOS)
                elif t in newline:
                    finish(c, Finish.NEWLINE)
                else:
                    stack.append(c)  # the budget is checked when it is popped
            continue
        # the constrained answer (section 1)
        m = s.matcher
        assert m is not None
        if m.error is not None:
            finish(s, Finish.CONSTRAINT_ERROR)
            continue
        if m.stopped:
            finish(s, Finish.CONSTRAINT_COMPLETE)
            continue
        allowed_t = m.allowed_mask()
        if s.first_answer and sem.first_allowed is not None:
            allowed_t = allowed_t & sem.first_allowed
        if s.caps is not None and (extra := s.caps.allowed()) is not None:
            allowed_t = allowed_t & extra[: allowed_t.shape[0]]
        allowed = allowed_t.numpy()
        if not allowed.any():
            finish(s, Finish.CONSTRAINT_ERROR)
            continue
        if s.first_answer:
            if sem.first_allowed is None:
                s.masked_mass = _masked_mass(logits, allowed)
            s.first_answer = False
        branches, lost = _branches(model, node, logits, allowed, temperature)
        unresolved += s.p * lost
        for t, q in branches:
            c = s.extend(q, t, sem.answer_phase)
            if t in eos:
                finish(c, Finish.EOS)
            elif c.matcher is None or not c.matcher.consume(t):
                finish(c, Finish.CONSTRAINT_ERROR)
            else:
                if c.caps is not None:
                    c.caps.advance(tok.engine.ll.decode_bytes([t]))
                stack.append(c)  # the budget is checked when it is popped
    return Distribution(done, unresolved)


@dataclass
class FreeRun:
    """One way paper 000's free pass can go: its tokens, delta_t at every step (None on forced RC steps), the end
    step, and its probability."""

    p: float
    tokens: list[int]
    deltas: list[float | None]
    end: int


def free_runs(model: RowModel, prefix: Sequence[int], start: torch.Tensor, eos: frozenset[int], budget: int,
              temperature: float) -> tuple[list[FreeRun], float]:
    """Every free pass with its probability, and the mass that cannot be enumerated (docs/ALGORITHMS.md section 6 and
    the strategies' sampled rule): the pass ends where the unmasked argmax is EOS or the budget is spent; under
    sampling it draws from the unmasked ``softmax(logits / T)``, and a drawn EOS ends it at that step too. delta_t
    always comes from the raw logits (temperature 1), as the penalty is defined."""
    s = start.numpy()
    runs: list[FreeRun] = []
    unresolved = 0.0
    stack = [FreeRun(1.0, [], [], -1)]
    while stack:
        r = stack.pop()
        t = len(r.tokens)
        if t < len(prefix) and t < budget:
            r.deltas.append(None)
            r.tokens.append(prefix[t])
            stack.append(r)
            continue
        node = model.node(r.tokens)
        logits = model.logits_at(node).numpy().astype(np.float64)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        r.deltas.append(float(p.max() - p[s].max()))
        if t >= budget or int(np.argmax(logits)) in eos:
            r.end = t
            runs.append(r)
            continue
        if temperature <= 0.0:
            r.tokens.append(int(np.argmax(logits)))
            stack.append(r)
            continue
        x = logits / temperature
        q = np.exp(x - x.max())
        q /= q.sum()
        p_eos = float(q[sorted(eos)].sum())
        on = [(v, float(q[v])) for v in model.probs_at(node) if v not in eos and q[v] > 0.0]
        unresolved += r.p * max(0.0, 1.0 - p_eos - sum(w for _, w in on))
        if r.p * p_eos >= NEGLIGIBLE:
            runs.append(FreeRun(r.p * p_eos, list(r.tokens), list(r.deltas), t))
        else:
            unresolved += r.p * p_eos
        stack.extend(FreeRun(r.p * w, [*r.tokens, v], list(r.deltas), -1) for v, w in on)
    return runs, unresolved


def branch_point(deltas: Sequence[float | None], end: int, rule: str, tau: float) -> int:
    """t* (docs/ALGORITHMS.md section 6): pipeline = the end; last = the latest step with delta <= tau (the end
    counts); min = the argmin of delta, ties to the latest step.

    Written from the specification on purpose, not imported from ``strategies.suffix.choose_branch``: this
    module is the oracle the suffix strategies are checked against, so it shares nothing with them but the
    model and the constraint's language (module docstring)."""
    steps = [t for t in range(end + 1) if deltas[t] is not None]
    if rule == "pipeline":
        return end
    vals = [(d, t) for t in steps if (d := deltas[t]) is not None]
    if rule == "last":
        below = [t for d, t in vals if d <= tau]
        return below[-1] if below else end
    if rule == "min":
        best = min(d for d, _ in vals)
        return max(t for d, t in vals if d == best)
    raise ValueError(f"unknown suffix rule {rule!r}")


def suffix_distribution(model: RowModel, tok: TokenizerInfo, constraint: Constraint, prefix: Sequence[int],
                        max_tokens: int, reserve: int, rule: str, tau: float, temperature: float) -> Distribution:
    """Every output of suffix-pipeline / -last / -min / -beam: y<t* then complete_T from there, for every free
    pass (greedy: one). The beam's output equals the lazy form's (section 6) in law as well: its constrained
    row draws from its own generator, so the completion that survives is a fresh draw from x + y<t*."""
    from formtax.strategies.suffix_policies import suffix_answer

    ans = suffix_answer(constraint, tok)
    runs, unresolved = free_runs(model, prefix, ans.start, tok.eos_ids, max_tokens - reserve, temperature)
    outcomes: list[Outcome] = []
    for run in runs:
        t_star = branch_point(run.deltas, run.end, rule, tau)
        kept = run.tokens[:t_star]
        sem = Semantics(Kind.CONSTRAINED, max_tokens=max_tokens - len(kept), grammar=ans.grammar,
                        first_allowed=ans.start)
        d = distribution(_Shifted(model, kept), tok, sem, temperature)  # type: ignore[arg-type]
        unresolved += run.p * d.unresolved
        phases = ["rc" if k < len(prefix) else "reasoning" for k in range(len(kept))]
        for o in d.outcomes:
            outcomes.append(Outcome(run.p * o.p, kept + o.tokens, phases + o.phases, o.finish, None,
                                    {"t_star": t_star, "delta_at_t_star": run.deltas[t_star], "free_end": run.end}))
    return Distribution(outcomes, unresolved)


class _Shifted:
    """A row model seen after a fixed prefix of generated tokens (for completions from a branch point)."""

    def __init__(self, model: RowModel, prefix: list[int]) -> None:
        self.model = model
        self.prefix = prefix

    def node(self, generated: Sequence[int]) -> int | None:
        return self.model.node(self.prefix + list(generated))

    def logits_at(self, node: int | None) -> torch.Tensor:
        return self.model.logits_at(node)

    def probs_at(self, node: int | None) -> dict[int, float]:
        return self.model.probs_at(node)

    def logits(self, generated: Sequence[int]) -> torch.Tensor:
        return self.model.logits(self.prefix + list(generated))

