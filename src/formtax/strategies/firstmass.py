"""The first-token masked mass of an unconstrained decode (paper 002 section 3.5), measured without a mask.

For a choice answer (``choice:a|b|...``), the *masked mass* is the probability the model puts, at its first
free token, on tokens that could not begin any allowed answer: one minus the feasible mass of Reddy et al.
(2026). It is read from the ``short`` condition (the control of the primary contrast), where nothing is
masked, so the wrapper below only looks at the raw logits and never changes what is chosen.

The allowed set is the paper's (section 3.5): "derived from the tokenizer for every enum member, admitting both
space-prefixed and bare encodings", i.e. the first token of the tokenizer's encoding of each option, bare
(``Zapier``) and space-prefixed (`` Zapier``). formtax used a wider set before (every token whose text is a non-empty
prefix of either spelling, a lone ``" "`` included: 36 tokens where the paper's rule gives 12 on SmolLM2 with six
options); it is still recorded as ``masked_mass_prefixes`` so the analyses can show how much the choice moves them
(the breakpoint table fits both). Three numbers are recorded:

- ``masked_mass``: exact, from the full softmax (in-process backends see every logit);
- ``masked_mass_topk`` with ``topk_coverage``: what a server returning only the top-k log-probabilities would
  see: the forbidden mass among the top k, a lower bound of the exact value, and the total mass of those k
  (the exact value lies in ``[masked_mass_topk, masked_mass_topk + 1 - topk_coverage]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from formtax.decoding.engine import TokenizerInfo
from formtax.decoding.loop import Plan, Policy, relay
from formtax.decoding.plan import Wrapping

TOP_K = 20
EVENT = "first_token_mass"
"""The event key the wrapper records, and the ``Result.stats`` key the ``short`` strategy copies it to."""

_TEXT_INDEX: dict[int, tuple[Any, dict[str, list[int]]]] = {}


def _text_index(tok: TokenizerInfo) -> dict[str, list[int]]:
    """Token text -> ids (special tokens and EOS left out), built once per tokenizer object."""
    cached = _TEXT_INDEX.get(id(tok.hf))
    if cached is not None and cached[0] is tok.hf:
        return cached[1]
    special = set(getattr(tok.hf, "all_special_ids", []) or []) | set(tok.eos_ids)
    vocab_ids = sorted(i for i in tok.hf.get_vocab().values() if i < tok.n_logits and i not in special)
    index: dict[str, list[int]] = {}
    for i in vocab_ids:
        text = tok.decode([i])
        if text:
            index.setdefault(text, []).append(i)
    _TEXT_INDEX[id(tok.hf)] = (tok.hf, index)  # holding hf keeps its id from being reused
    return index


def allowed_first_tokens(tok: TokenizerInfo, options: Sequence[str]) -> torch.Tensor:
    """Bool mask [n_logits], the paper's set: the first token of each option's encoding, bare and space-prefixed."""
    mask = torch.zeros(tok.n_logits, dtype=torch.bool)
    for o in options:
        for spelled in (o, " " + o):
            ids = tok.encode(spelled)
            if ids and ids[0] < tok.n_logits:
                mask[ids[0]] = True
    return mask


def prefix_first_tokens(tok: TokenizerInfo, options: Sequence[str]) -> torch.Tensor:
    """Bool mask [n_logits], the wider set (module docstring): tokens whose text is a non-empty prefix of an
    option, bare or space-prefixed."""
    index = _text_index(tok)
    prefixes = {s[:j] for o in options for s in (o, " " + o) for j in range(1, len(s) + 1)}
    mask = torch.zeros(tok.n_logits, dtype=torch.bool)
    ids = [i for p in prefixes for i in index.get(p, ())]
    if ids:
        mask[ids] = True
    return mask


def first_token_mass(logits: torch.Tensor, allowed: torch.Tensor, k: int = TOP_K,
                     wider: torch.Tensor | None = None) -> dict[str, float | int]:
    """The exact masked mass, the top-k lower bound and its coverage, from one raw logits row; with ``wider``,
    the exact masked mass under that set too (``masked_mass_prefixes``)."""
    p = torch.softmax(logits.double(), dim=-1)
    top = torch.topk(p, min(k, p.shape[0]))
    forbidden_top = ~allowed[top.indices]
    extra = {} if wider is None else {"masked_mass_prefixes": float(1.0 - p[wider].sum().item())}
    return extra | {
        "masked_mass": float(1.0 - p[allowed].sum().item()),
        "masked_mass_topk": float(top.values[forbidden_top].sum().item()),
        "topk_coverage": float(top.values.sum().item()),
        "k": int(top.values.shape[0]),
        "n_allowed": int(allowed.sum().item()),
    }


class FirstTokenMass(Wrapping):
    """Wrap a policy: at its first step, record :func:`first_token_mass` as an event; change nothing else."""

    def __init__(self, inner: Policy, allowed: torch.Tensor, k: int = TOP_K, wider: torch.Tensor | None = None
                 ) -> None:
        self.inner = inner
        self.allowed = allowed
        self.wider = wider
        self.k = k
        self.done = False
        self.phase = inner.phase

    def plan(self, logits: torch.Tensor, step: int) -> Plan:
        plan = relay(self.inner.plan(logits, step), self._sync)
        self.phase = self.inner.phase
        if not self.done and plan.forced is None and plan.stop is None:
            self.done = True
            plan.event = {**(plan.event or {}), EVENT: first_token_mass(logits, self.allowed, self.k, self.wider)}
        return plan

    def _sync(self) -> None:
        self.phase = self.inner.phase

    def advance(self, token: int) -> str | None:
        reason = self.inner.advance(token)
        self.phase = self.inner.phase
        return reason

