"""The decode loop's own cost per row-step, with a model that costs nothing (issue 18).

    python bench/loop_overhead.py            # a table, then one JSON line

The model returns one fixed logits tensor (no forward pass), so what is timed is formtax: planning, masking,
choosing, bookkeeping. Rows never stop early (EOS is never the argmax), so every row takes ``--steps`` steps.
Vocabularies: the embedded default's real 49k tokenizer, and 262k logits over the byte tokenizer (Gemma's width;
there the constrained mask is over the byte vocabulary, padded, so only free decoding is representative).
closing (49k only): the constrained JSON row in closing mode over its whole budget (the string must close before
it ends, so the budget binds in the last steps). decog (49k only): Deco-G with a random 64-state HMM and top-k = 5% of it, "The answer is: {int:0..}", EOS held off.
``engine_us``: llguidance computing the same grammar's mask along the same path, alone, in the same run: the
floor of a constrained step. ratio = free us per row-step at batch 64 (49k) (target <= 15).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from _common import finish

from formtax.constraints import compile_grammar, parse_spec
from formtax.constraints.closing import start_witness
from formtax.decoding import RowRequest, decode
from formtax.decoding.engine import Backend, Batch, TokenizerInfo
from formtax.decoding.policies import ConstrainedPolicy, FreePolicy, InWritingPolicy

SCHEMA = 'json:{"type":"object","properties":{"s":{"type":"string"}},"required":["s"]}'


class FixedBatch(Batch):
    """Every row's logits are the same fixed row: a zero-cost model."""

    def __init__(self, row: torch.Tensor, n: int) -> None:
        self.buf = row.unsqueeze(0).expand(n, -1).contiguous()
        self.n = n

    def prefill(self) -> torch.Tensor:
        return self.buf[: self.n]

    def step(self, tokens: Sequence[int]) -> torch.Tensor:
        return self.buf[: len(tokens)]

    def keep(self, live_positions: Sequence[int]) -> None:
        self.n = len(live_positions)

    def crop(self, live_position: int, n_generated: int) -> None:
        raise NotImplementedError


class FixedBackend(Backend):
    name = "fixed"

    def __init__(self, tok: TokenizerInfo, seed: int = 0) -> None:
        self._tok = tok
        g = torch.Generator().manual_seed(seed)
        self.row = torch.randn(tok.n_logits, generator=g)
        self.row[sorted(tok.eos_ids | {tok.pad_id})] = -1e9  # never stop: every row runs its full budget

    @property
    def tokenizer(self) -> TokenizerInfo:
        return self._tok

    @property
    def model_id(self) -> str:
        return f"fixed-{self._tok.n_logits}"

    def new_batch(self, prompts: Sequence[Sequence[int]]) -> FixedBatch:
        return FixedBatch(self.row, len(prompts))


_FEM: dict[int, Any] = {}
HMM_STATES = 64  # decog: a random HMM this size over the vocabulary; top-k = 5% of it (Deco-G's default)


def fem_runtime(tok: TokenizerInfo, steps: int) -> Any:
    """Deco-G's runtime for "The answer is: {int:0..}" over ``tok`` (built once per vocabulary, tables too)."""
    if tok.n_logits not in _FEM:
        from formtax.constraints.template import parse_template
        from formtax.fem.dfa import FormatSpec, build_token_dfa, vocab_for
        from formtax.fem.hmm import HMM
        from formtax.fem.reweight import FemRuntime

        dfa = build_token_dfa(FormatSpec(parse_template("The answer is: {int:0..}")), vocab_for(tok))
        rt = FemRuntime(dfa, HMM.random(HMM_STATES, tok.n_logits, seed=0), sorted(tok.eos_ids))
        rt.tables(steps, min_tokens=steps)
        _FEM[tok.n_logits] = rt
    return _FEM[tok.n_logits]


def policy(kind: str, tok: TokenizerInfo, steps: int) -> Any:
    if kind == "free":
        return FreePolicy(tok.eos_ids)
    if kind == "decog":
        from formtax.fem.reweight import FemPolicy

        return FemPolicy(fem_runtime(tok, steps), steps, gamma=1.0, top_k=max(1, HMM_STATES // 20), min_tokens=steps)
    compiled = compile_grammar(parse_spec(SCHEMA).grammar, tok.engine)
    m = compiled.matcher(tok.n_logits)
    if kind == "closing":  # closing mode over the row's whole budget (it binds at the end: the string must close)
        answer = ConstrainedPolicy(m, tok.eos_ids, closing_limit=steps)
        assert answer.closer is not None
        answer.closer.start_from(start_witness(compiled, tok.n_logits))
        return answer
    answer = ConstrainedPolicy(m, tok.eos_ids)
    if kind == "constrained":
        return answer
    return InWritingPolicy(answer, frozenset(tok.eos_ids | {tok.pad_id}), frozenset(), steps // 2)


def per_row_step_us(backend: FixedBackend, kind: str, batch: int, steps: int, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        rows = [RowRequest([1, 2, 3], policy(kind, backend.tokenizer, steps), steps) for _ in range(batch)]
        t = time.perf_counter()
        outs = decode(backend, rows)
        dt = time.perf_counter() - t
        out.append(dt / max(1, sum(len(o.tokens) for o in outs)) * 1e6)
    return statistics.median(out)


def engine_us(backend: FixedBackend, steps: int) -> float:
    """llguidance alone: its bitmask along the path the constrained rows take."""
    tok = backend.tokenizer
    (o,) = decode(backend, [RowRequest([1, 2, 3], policy("constrained", tok, steps), steps)])
    ll = compile_grammar(parse_spec(SCHEMA).grammar, tok.engine).matcher(tok.n_logits).ll
    times = []
    for t in o.tokens:
        s = time.perf_counter()
        ll.compute_bitmask()
        times.append(time.perf_counter() - s)
        ll.consume_token(t)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", default="1,8,64")
    a = ap.parse_args()
    from formtax.planted.backend import planted_tokenizer

    smol = planted_tokenizer("smollm2")
    byte = planted_tokenizer("bytes")
    wide = TokenizerInfo(hf=byte.hf, eos_ids=byte.eos_ids, pad_id=byte.pad_id, n_logits=262_144,
                         has_chat_template=True)
    results: dict[str, Any] = {}
    print("| vocabulary | strategy | batch | us per row-step |")
    print("|---|---|---|---|")
    for label, tok in (("49k", smol), ("262k", wide)):
        backend = FixedBackend(tok)
        kinds = ("free", "constrained", "closing", "inwriting", "decog") if label == "49k" else (
            "free", "constrained", "inwriting")
        for kind in kinds:
            for b in (int(x) for x in a.batches.split(",")):
                us = per_row_step_us(backend, kind, b, a.steps, a.repeats)
                results[f"{label}_{kind}_b{b}_us"] = round(us, 1)
                print(f"| {label} | {kind} | {b} | {us:.1f} |")
        results[f"{label}_engine_mask_us"] = round(engine_us(backend, a.steps), 1)
        print(f"| {label} | llguidance mask alone | 1 | {results[f'{label}_engine_mask_us']:.1f} |")
    free64 = results.get("49k_free_b64_us", results.get("49k_free_b1_us"))
    top = max(int(x) for x in a.batches.split(","))
    json_us, closing_us = results[f"49k_constrained_b{top}_us"], results[f"49k_closing_b{top}_us"]
    engine = results["49k_engine_mask_us"]
    extra = {"closing_over_constrained": round(closing_us / json_us, 3), "closing_target": 1.2,
             "constrained_over_engine": round(json_us / engine, 2), "constrained_target": 3.0}
    print(f"at batch {top}, 49k: closing / constrained = {extra['closing_over_constrained']} (target <= 1.2); "
          f"constrained / llguidance's mask = {extra['constrained_over_engine']} (target <= 3)")
    finish({"bench": "loop_overhead", **results, **extra, "ratio": free64, "target": 15.0, "better": "lower"})


if __name__ == "__main__":
    main()
