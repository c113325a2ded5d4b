"""Backward tables, the per-step reweighting and its decode-loop policy (docs/ALGORITHMS.md section 7).

The event alpha, made exact (our choice of how "within [min_len, max_len] tokens" is counted): generation stops
either by EOS or by the budget running out, and alpha holds when the DFA is in an accepting state at that moment.
With ``r`` tokens of budget left, D in state ``s`` and the next token emitted by hidden state ``z``:

    T_0[s, z] = 1[s accepting]
    T_r[s, z] = B[z, EOS] 1[s accepting] 1[EOS allowed here] + sum_{v != EOS} B[z, v] sum_z' A[z, z'] T_{r-1}[delta(s, v), z']

The stopping events (first EOS at each position, or none before the budget) are disjoint, so T is a probability
(the spec's "sum W_r over the allowed remaining-length range" is this sum, taken over the stopping time). EOS is
allowed once at least ``min_tokens`` tokens were generated; ``min_tokens = 0`` in the strategies. The sum over
``v`` runs over the DFA's edges: each edge (s -> s') carries the emission mass of its tokens under every hidden
state, computed once per (DFA, HMM) from the token classes. All tables are computed in log space (float64) and
kept as

    U_r[s', z] = log sum_z' A[z, z'] exp T_r[s', z']     (alpha after the chosen token, given the state that emitted it)

so that one step of decoding, with forward vector ``f[z] = log P(z emits the next token | text so far)``, is

    num[v] = logsumexp_z ( f[z] + log B[z, v] + U_{r-1}[delta(d, v), z] )
    den[v] = logsumexp_z ( f[z] + log B[z, v] )
    score[v] = log p_LM(v) + gamma (num[v] - den[v])     renormalised; EOS: log p_LM(EOS) where D accepts

(``num - den = log P_HMM(alpha | text, v)``; after EOS, alpha holds with probability 1 in an accepting state).
The hard mask is structural, not probabilistic: a token is allowed only if from its successor state generation can
still stop accepted within the remaining budget (:func:`feasibility`, a boolean twin of ``T``) and EOS only in
accepting states, so
format compliance is 100% whatever the HMM says. Both products are computed as one matrix product
``exp(W - c) @ B`` over the distinct successor states of ``d`` (rarely more than three), so a step costs
O((m + 1) h |V|); with top-k pruning, only the k most probable hidden states of ``f`` enter (rows of ``B``
gathered), O((m + 1) k |V| + h log h), and the probability mass those k states hold is recorded at every step.
With k < h, num and den are both sums over the same k states (their ratio needs no renormalisation).

Our choices beyond the spec: the HMM never sees the prompt (its forward vector starts at ``pi`` on the first
generated token, and a forced RC prefix is fed to it like generated text); with sampling, the decode loop draws from
``softmax(score / T)``, so the temperature applies to the reweighted distribution.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from formtax.decoding.loop import Plan, Policy
from formtax.decoding.plan import Finish, Phase
from formtax.fem.dfa import TokenDFA
from formtax.fem.hmm import HMM

NEG_INF = float("-inf")
UNDERFLOW = -60.0


def _logmatmulexp_rows(logx: torch.Tensor, mat: torch.Tensor) -> torch.Tensor:
    """log(exp(logx) @ mat) row by row, stable; rows of all -inf stay -inf."""
    m = logx.amax(dim=1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return torch.log(torch.exp(logx - m) @ mat) + m


def _edges(dfa: TokenDFA, hmm: HMM, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(source, target, log emission mass [E, h]) of every non-dead edge; EOS and specials lead to the sink."""
    dev = hmm.B.device
    tc = torch.as_tensor(dfa.token_class, dtype=torch.long, device=dev)
    bc = torch.zeros(hmm.h, dfa.n_classes, dtype=dtype, device=dev).index_add_(1, tc, hmm.B.to(dtype))
    src, cls = np.nonzero(dfa.delta != dfa.dead)
    keep = src != dfa.dead
    src, cls = src[keep], cls[keep]
    dst = dfa.delta[src, cls]
    key = src.astype(np.int64) * dfa.n_states + dst
    uniq, inv = np.unique(key, return_inverse=True)
    mass = torch.zeros(len(uniq), hmm.h, dtype=dtype, device=dev)
    mass.index_add_(0, torch.as_tensor(inv.reshape(-1), device=dev), bc.T[torch.as_tensor(cls, device=dev)])
    e_src = torch.as_tensor(uniq // dfa.n_states, dtype=torch.long, device=dev)
    e_dst = torch.as_tensor(uniq % dfa.n_states, dtype=torch.long, device=dev)
    return e_src, e_dst, torch.log(mass)


def backward_tables(dfa: TokenDFA, hmm: HMM, budget: int, eos_ids: Sequence[int], min_tokens: int = 0,
                    out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``U[r, s, z]`` for r = 0 .. budget - 1 (see the module docstring), computed in float64."""
    dt = torch.float64
    dev = hmm.B.device
    h, n = hmm.h, dfa.n_states
    A_T = hmm.A.to(dt).T.contiguous()
    e_src, e_dst, log_mass = _edges(dfa, hmm, dt)
    eos = list(eos_ids)
    log_eos = torch.log(hmm.B[:, eos].to(dt).sum(dim=1)) if eos else torch.full((h,), NEG_INF, dtype=dt, device=dev)
    acc = torch.as_tensor(dfa.accepting, device=dev)
    T = torch.where(acc[:, None], 0.0, NEG_INF).to(dt).expand(n, h).contiguous()
    out = torch.empty(max(budget, 0), n, h, dtype=out_dtype, device=dev)
    idx = e_src[:, None].expand(-1, h)
    for r in range(1, budget + 1):
        U = _logmatmulexp_rows(T, A_T)
        out[r - 1] = U.to(out_dtype)
        if r == budget:
            break
        vals = log_mass + U[e_dst]
        mx = torch.full((n, h), NEG_INF, dtype=dt, device=dev).scatter_reduce(0, idx, vals, "amax")
        mx_safe = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
        s = torch.zeros(n, h, dtype=dt, device=dev).index_add_(0, e_src, torch.exp(vals - mx_safe[e_src]))
        T = torch.log(s) + mx_safe
        if budget - r >= min_tokens:
            T = torch.where(acc[:, None], torch.logaddexp(T, log_eos[None, :].expand(n, h)), T)
    return out


def feasibility(dfa: TokenDFA, budget: int, min_tokens: int = 0) -> np.ndarray:
    """``F[r, s]``: from state ``s`` with at most ``r`` tokens of budget left, generation can stop accepted (by
    EOS where allowed, or by the budget running out). The hard mask allows a token iff ``F[r_after, next]``; with
    ``min_tokens = 0`` this is ``dist[next] <= r_after``."""
    acc = dfa.accepting.copy()
    acc[dfa.dead] = False
    live = np.ones(dfa.n_states, dtype=bool)
    live[dfa.dead] = False
    F = np.zeros((max(budget, 1), dfa.n_states), dtype=bool)
    cur = acc.copy()
    F[0] = cur
    for r in range(1, budget):
        nxt = cur[dfa.delta].any(axis=1) & live
        if budget - r >= min_tokens:
            nxt |= acc
        cur = nxt
        F[r] = cur
    return F


@dataclass
class StepResult:
    scores: torch.Tensor  # [V] renormalised log-probabilities, -inf outside ``allowed``
    allowed: torch.Tensor  # [V] bool
    kept_mass: float  # probability mass of the hidden states used (1.0 without pruning)


class FemRuntime:
    """A (DFA, HMM) pair on one device: the tables per budget and the per-state tensors, cached."""

    def __init__(self, dfa: TokenDFA, hmm: HMM, eos_ids: Sequence[int], device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        if dfa.vocab_size != hmm.vocab_size:
            raise ValueError(f"the DFA covers {dfa.vocab_size} token ids but the HMM emits {hmm.vocab_size}")
        self.dfa = dfa
        self.hmm = hmm.to(device=device, dtype=dtype)
        self.device = self.hmm.B.device
        self.dtype = dtype
        self.eos_ids = sorted(int(e) for e in eos_ids)
        self.log_pi = torch.log(self.hmm.pi)
        self._tables: OrderedDict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._state: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._lock = threading.Lock()

    @property
    def h(self) -> int:
        return self.hmm.h

    def nbytes(self) -> int:
        """Memory held by the cached tables and per-state tensors (what a runtime cache must bound: a template
        per request, e.g. event argument extraction's passage spans, gives a new DFA and new tables each time)."""
        with self._lock:
            tables = sum(u.element_size() * u.nelement() + f.element_size() * f.nelement()
                         for u, f in self._tables.values())
        states = sum(t.element_size() * t.nelement() for ts in list(self._state.values()) for t in ts)
        return tables + states

    def tables(self, budget: int, min_tokens: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """(``U`` [budget, states, h], feasibility ``F`` [budget, states]) for a row with this budget."""
        key = (budget, min_tokens)
        with self._lock:
            hit = self._tables.get(key)
            if hit is not None:
                self._tables.move_to_end(key)
                return hit
            # With min_tokens = 0 nothing depends on the budget: a longer table holds this one as its first rows.
            if min_tokens == 0:
                for (b, m), (u, f) in self._tables.items():
                    if m == 0 and b >= budget:
                        return u[:budget], f[:budget]
        u = backward_tables(self.dfa, self.hmm, budget, self.eos_ids, min_tokens, out_dtype=self.dtype)
        f = torch.as_tensor(feasibility(self.dfa, budget, min_tokens), device=self.device)
        with self._lock:
            self._tables[key] = (u, f)
            while len(self._tables) > 4:
                self._tables.popitem(last=False)
        return u, f

    def state_tensors(self, d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(distinct live successor states [m], row per token [V] (0 = the sink), successor state [V])."""
        hit = self._state.get(d)
        if hit is None:
            nxt = self.dfa.next_states(d)
            succ = np.unique(nxt[nxt != self.dfa.dead])
            rowmap = np.zeros(self.dfa.n_states, dtype=np.int64)
            rowmap[succ] = np.arange(1, len(succ) + 1)
            row = np.where(nxt == self.dfa.dead, 0, rowmap[nxt])
            hit = (torch.as_tensor(succ.astype(np.int64), device=self.device),
                   torch.as_tensor(row, device=self.device),
                   torch.as_tensor(nxt.astype(np.int64), device=self.device))
            self._state[d] = hit
        return hit

    def step(self, logits: torch.Tensor, logf: torch.Tensor, d: int, r_after: int,
             tables: tuple[torch.Tensor, torch.Tensor], gamma: float, top_k: int | None = None,
             eos_ok: bool = True) -> StepResult:
        """The reweighted next-token distribution at DFA state ``d`` with ``r_after`` tokens left after it."""
        table, feasible = tables
        logits = logits.to(device=self.device, dtype=self.dtype)
        logp = torch.log_softmax(logits, dim=-1)
        _, row, nxt = self.state_tensors(d)
        allowed = feasible[r_after][nxt]
        score = logp
        kept = 1.0
        if top_k is not None:
            k = min(top_k, self.h)
            idx = torch.topk(logf, k).indices.sort().values
            kept = float(torch.exp(torch.logsumexp(logf[idx], dim=0)))
        if gamma != 0.0:
            delta = self._log_alpha(logf, d, r_after, table, row, allowed, idx if top_k is not None else None)
            score = logp + gamma * delta
        if self.eos_ids:
            eos = torch.as_tensor(self.eos_ids, device=self.device)
            ok = bool(self.dfa.accepting[d]) and eos_ok
            allowed[eos] = ok
            score = score.index_put((eos,), logp[eos])
        score = score.masked_fill(~allowed, NEG_INF)
        return StepResult(torch.log_softmax(score, dim=-1), allowed, kept)


    def _log_alpha(self, logf: torch.Tensor, d: int, r_after: int, table: torch.Tensor, row: torch.Tensor,
                   allowed: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
        """``num[v] - den[v]`` for every token (0 where not allowed), over the hidden states ``idx`` (all if None)."""
        succ = self.state_tensors(d)[0]
        table_r = table[r_after].index_select(0, succ)
        if idx is not None:
            fk = logf[idx]
            W = torch.cat([fk[None, :], fk[None, :] + table_r.index_select(1, idx)], dim=0)
        else:
            W = torch.cat([logf[None, :], logf[None, :] + table_r], dim=0)
        c = W.amax(dim=1, keepdim=True)
        c = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
        # Terms below e^-60 of their row's largest are dropped (relative error < h e^-60): their products with B
        # would be subnormal floats, which make CPU matrix products an order of magnitude slower.
        shifted = W - c
        E = torch.exp(shifted).masked_fill_(shifted < UNDERFLOW, 0.0)
        if idx is not None:
            rows = E.shape[0]
            # sum_j E[row, j] B[idx_j, :] reading only the k rows of B (no gathered copy of them)
            P = torch.nn.functional.embedding_bag(
                idx.repeat(rows), self.hmm.B, torch.arange(0, rows * len(idx), len(idx), device=self.device),
                mode="sum", per_sample_weights=E.reshape(-1))
        else:
            P = E @ self.hmm.B
        # num - den = log P[row(v), v] + c[row(v)] - log P[0, v] - c[0]; tokens into the sink are masked
        num = torch.log(P.gather(0, row[None, :])[0]) + c[:, 0][row]
        return (num - torch.log(P[0]) - c[0, 0]).masked_fill_(~allowed, 0.0)


class FemPolicy(Policy):
    """Deco-G / Ctrl-G decoding for one row: reweight every step by the FEM, hard-mask, update D and the HMM."""

    phase = Phase.MAIN

    def __init__(self, runtime: FemRuntime, budget: int, gamma: float = 1.0, top_k: int | None = None,
                 prefix: Sequence[int] = (), min_tokens: int = 0) -> None:
        self.rt = runtime
        self.budget = budget
        self.gamma = float(gamma)
        self.top_k = top_k if top_k is not None and top_k < runtime.h else None  # k >= h: exactly unpruned
        self.min_tokens = min_tokens
        self.tables = runtime.tables(budget, min_tokens) if budget > 0 else None
        self.d = runtime.dfa.start
        self.logf = runtime.log_pi.clone()
        self.n = 0
        self.first = True
        for t in prefix:  # tokens already written (a forced RC prefix): D and the HMM read them, the budget too
            self._consume(int(t))

    def _consume(self, token: int) -> None:
        self.d = self.rt.dfa.step(self.d, token)
        self.logf = self.rt.hmm.forward_step(self.logf, token)
        self.n += 1

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        if self.d == self.rt.dfa.dead or self.tables is None:
            return Plan(stop=Finish.CONSTRAINT_ERROR)
        r_after = self.budget - self.n - 1
        if r_after < 0:
            return Plan(stop=self.budget_exhausted())
        t0 = time.perf_counter()
        res = self.rt.step(logits, self.logf, self.d, r_after, self.tables, self.gamma, self.top_k,
                           eos_ok=self.n >= self.min_tokens)
        if not bool(res.allowed.any()):
            return Plan(stop=Finish.CONSTRAINT_ERROR)
        allowed = res.allowed.to(logits.device)
        measure, self.first = self.first, False
        event = {"fem_mass": res.kept_mass, "fem_s": time.perf_counter() - t0}
        return Plan(allowed=allowed, scores=res.scores.to(device=logits.device, dtype=logits.dtype),
                    measure_mass=measure, event=event)

    def advance(self, token: int) -> str | None:
        if token in self.rt.eos_ids:
            return Finish.EOS
        self._consume(token)
        if self.d == self.rt.dfa.dead:
            return Finish.CONSTRAINT_ERROR
        return None

    @property
    def accepting(self) -> bool:
        return bool(self.rt.dfa.accepting[self.d])

    def budget_exhausted(self) -> str:
        return Finish.LENGTH if self.accepting else Finish.LENGTH_INCOMPLETE
