"""The exact output distribution of Deco-G / Ctrl-G on a planted world, written from docs/ALGORITHMS.md section 7.

What is shared with the lab: the model (the planted row model's logits), the format's language (the token DFA
built from the request's template, which ``tests/fem`` checks against the template's regex) and the FEM itself
(the HMM artifact). What is written again here, in plain float64 numpy and without the lab's tricks (edge lists,
cached tables, underflow cut-offs, embedding bags): the backward tables of the event alpha, the structural
feasibility mask, the per-step reweighting ``score[v] = log p_LM(v) + gamma (num[v] - den[v])`` with top-k
state pruning, the HMM's forward update, and the choice (greedy: the masked argmax; sampling at T: the exact
probabilities of ``softmax(score / T)``). A bug in ``formtax.fem.reweight``, the policy or the decode loop then
shows up as a difference between the lab's estimate and this truth.

The event alpha, as ``reweight`` defines it (our choice, documented there): generation stops by EOS or by the
budget running out, in an accepting state. With ``r`` tokens left, DFA state ``s`` and hidden state ``z`` about
to emit:

    T_0[s, z] = 1[s accepting]
    T_r[s, z] = B[z, EOS] 1[s accepting] + sum_{v not special} B[z, v] sum_z' A[z, z'] T_{r-1}[delta(s, v), z']

and after choosing ``v`` with ``r`` tokens left, ``P(alpha | text, v) = sum_z f[z] B[z, v] (A T_r)[s', z] /
sum_z f[z] B[z, v]`` over the kept states ``z`` of the forward vector ``f``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

from formtax.decoding.plan import Finish
from formtax.fem.dfa import TokenDFA
from formtax.fem.hmm import HMM
from formtax.planted.backend import RowModel
from formtax.planted.exact import NEGLIGIBLE, SMALL_ALLOWED, Distribution, Outcome


@dataclass
class FemSpec:
    """One Deco-G / Ctrl-G call: its format DFA, HMM and settings."""

    dfa: TokenDFA
    hmm: HMM
    eos: frozenset[int]
    budget: int  # max_tokens, a forced RC prefix included
    gamma: float
    top_k: int | None  # None: every hidden state
    prefix: Sequence[int] = ()


class _Tables:
    """log U_r[s, z] = log sum_z' A[z, z'] T_r[s, z'] for r = 0 .. budget - 1, and the fewest tokens to accept."""

    def __init__(self, spec: FemSpec) -> None:
        with np.errstate(divide="ignore", invalid="ignore"):
            self._build(spec)

    def _build(self, spec: FemSpec) -> None:
        dfa, hmm = spec.dfa, spec.hmm
        B = hmm.B.double().cpu().numpy()
        self.logA = np.log(hmm.A.double().cpu().numpy())
        self.logB = np.log(B)
        self.log_pi = np.log(hmm.pi.double().cpu().numpy())
        n, h = dfa.n_states, hmm.h
        classes = np.asarray(dfa.token_class)
        mass = np.zeros((h, dfa.n_classes))
        np.add.at(mass.T, classes, B.T)  # [h, classes]: emission mass of each token class
        self.accepting = np.asarray(dfa.accepting, dtype=bool).copy()
        self.accepting[dfa.dead] = False
        eos = sorted(spec.eos)
        log_eos = np.log(B[:, eos].sum(axis=1)) if eos else np.full(h, -np.inf)
        delta = np.asarray(dfa.delta)
        log_mass = np.log(mass)
        T = np.where(self.accepting[:, None], 0.0, -np.inf) * np.ones((1, h))
        self.U = np.empty((max(spec.budget, 1), n, h))
        edge = (delta != dfa.dead) & (np.arange(n) != dfa.dead)[:, None]  # [n, classes]
        for r in range(spec.budget):
            self.U[r] = self._through_A(T)
            # an all -inf row (no way to accept) stays -inf: logsumexp warns about it, harmlessly
            terms = np.where(edge[:, :, None], log_mass.T[None, :, :] + self.U[r][delta], -np.inf)  # [n, C, h]
            T = logsumexp(terms, axis=1)
            T[self.accepting] = np.logaddexp(T[self.accepting], log_eos[None, :])
        # fewest tokens from each state to an accepting one (Bellman-Ford over the class graph)
        dist = np.where(self.accepting, 0, np.iinfo(np.int64).max // 4)
        for _ in range(n):
            best = np.min(dist[delta], axis=1) + 1
            new = np.minimum(dist, best)
            new[dfa.dead] = np.iinfo(np.int64).max // 4
            if np.array_equal(new, dist):
                break
            dist = new
        self.dist = dist

    def _through_A(self, T: np.ndarray) -> np.ndarray:
        """log sum_z' A[z, z'] exp T[s, z'] for every s."""
        return np.asarray(logsumexp(self.logA[None, :, :] + T[:, None, :], axis=2))


def _step(spec: FemSpec, tables: _Tables, logits: np.ndarray, logf: np.ndarray, d: int,
          r_after: int) -> tuple[np.ndarray, np.ndarray]:
    """(allowed [V], renormalised log-probabilities [V], -inf outside allowed) of the next token."""
    dfa = spec.dfa
    x = logits.astype(np.float64)
    logp = x - logsumexp(x)
    succ = np.asarray(dfa.next_states(d))
    live = succ != dfa.dead
    allowed = live & (tables.dist[np.where(live, succ, 0)] <= r_after)
    eos = sorted(spec.eos)
    score = logp.copy()
    if spec.gamma != 0.0:
        order = np.argsort(-logf, kind="stable")
        keep = order[: spec.top_k] if spec.top_k is not None and spec.top_k < len(logf) else np.arange(len(logf))
        f = logf[keep]
        den = logsumexp(f[:, None] + tables.logB[keep], axis=0)
        alpha = np.zeros_like(logp)
        for s2 in np.unique(succ[allowed]):
            cols = allowed & (succ == s2)
            num = logsumexp((f + tables.U[r_after][s2][keep])[:, None] + tables.logB[keep][:, cols], axis=0)
            alpha[cols] = num - den[cols]
        score = logp + spec.gamma * alpha
    allowed[eos] = bool(tables.accepting[d])
    score[eos] = logp[eos]
    score = np.where(allowed, score, -np.inf)
    if allowed.any():
        score = score - logsumexp(score[allowed])
    return allowed, score


def _forward(tables: _Tables, logf: np.ndarray, token: int) -> np.ndarray:
    """f <- log( exp(f + log B[:, v]) @ A ), normalised."""
    g = logsumexp((logf + tables.logB[:, token])[:, None] + tables.logA, axis=0)
    return np.asarray(g - logsumexp(g))


@dataclass
class _Prefix:
    """A partial output still being enumerated: its probability, tokens, DFA state and HMM forward vector."""

    p: float
    tokens: list[int]
    d: int
    logf: np.ndarray
    masked_mass: float | None = None


def fem_distribution(model: RowModel, spec: FemSpec, temperature: float) -> Distribution:
    """Every output of one Deco-G / Ctrl-G call with its probability; floor-level branches the world does not
    continue are counted in ``unresolved`` (as in :func:`formtax.planted.exact.distribution`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return _enumerate(model, spec, _Tables(spec), temperature)


def _enumerate(model: RowModel, spec: FemSpec, tables: _Tables, temperature: float) -> Distribution:
    dfa = spec.dfa
    logf = tables.log_pi - logsumexp(tables.log_pi)
    d = dfa.start
    for t in spec.prefix:  # a forced RC prefix: D and the HMM read it
        d = int(dfa.step(d, int(t)))
        logf = _forward(tables, logf, int(t))
    pending = [_Prefix(1.0, [int(t) for t in spec.prefix], d, logf)]
    done: list[Outcome] = []
    unresolved = 0.0
    while pending:
        r = pending.pop()
        n = len(r.tokens)
        phases = ["rc" if k < len(spec.prefix) else "reasoning" for k in range(n)]
        if r.d == dfa.dead:
            done.append(Outcome(r.p, r.tokens, phases, Finish.CONSTRAINT_ERROR, r.masked_mass))
            continue
        if n >= spec.budget:
            finish = Finish.LENGTH if tables.accepting[r.d] else Finish.LENGTH_INCOMPLETE
            done.append(Outcome(r.p, r.tokens, phases, finish, r.masked_mass))
            continue
        node = model.node(r.tokens)
        logits = model.logits_at(node).numpy()
        allowed, score = _step(spec, tables, logits, r.logf, r.d, spec.budget - n - 1)
        if not allowed.any():
            done.append(Outcome(r.p, r.tokens, phases, Finish.CONSTRAINT_ERROR, r.masked_mass))
            continue
        mm = r.masked_mass
        if n == len(spec.prefix):  # the loop measures the first step's mass outside the allowed set
            x = logits.astype(np.float64)
            pr = np.exp(x - logsumexp(x))
            mm = float(1.0 - pr[allowed].sum())
        if temperature <= 0.0:
            branches = [(int(np.argmax(score)), 1.0)]
        else:
            y = np.where(allowed, score / temperature, -np.inf)
            q = np.exp(y - logsumexp(y[allowed]))
            if int(allowed.sum()) <= SMALL_ALLOWED:
                cand = [int(v) for v in np.flatnonzero(allowed)]
            else:
                cand = [v for v in model.probs_at(node) if allowed[v]]
                cand += [v for v in spec.eos if allowed[v] and v not in cand]
            branches = [(v, float(q[v])) for v in cand if q[v] >= NEGLIGIBLE]
            unresolved += r.p * max(0.0, 1.0 - sum(w for _, w in branches))
        for v, w in branches:
            toks = [*r.tokens, v]
            if v in spec.eos:
                done.append(Outcome(r.p * w, toks, [*phases, "reasoning"], Finish.EOS, mm))
                continue
            pending.append(_Prefix(r.p * w, toks, int(dfa.step(r.d, v)), _forward(tables, r.logf, v), mm))
    return Distribution(done, unresolved)


def fem_answer(text: str, n_lines: int, leading_space: bool, pattern: bytes | None) -> str:
    """The answer of a Deco-G output (the strategy's reading, written again): the last ``n_lines`` lines
    (placement ``end``), or the last match of the template's pattern (``anywhere``), one leading space removed."""
    if pattern is None:
        answer = "\n".join(text.split("\n")[-n_lines:])
    else:
        import re

        data = text.encode("utf-8")
        found = [m.span() for m in re.finditer(pattern, data)]
        answer = data[found[-1][0] : found[-1][1]].decode("utf-8", errors="replace") if found else ""
    return answer[1:] if leading_space and answer.startswith(" ") else answer
