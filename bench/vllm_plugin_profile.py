"""Where formtax's vLLM plugin spends a step (issue 44's profile for bench/vllm_serve.py's misses): one in-process
engine with the plugin loaded, ``ROWS`` requests of one kind at once, under cProfile. It prints one JSON line per
kind: the wall time, the share of it inside the plugin's ``apply`` (and, within it, llguidance's mask fill and the
policies' planning), and the model's forward pass.

    .venv-vllm/bin/python bench/vllm_plugin_profile.py            # about 3 minutes on 2 cores
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import time
import warnings

from _common import PROMPTS

ROWS = 64
MAX_TOKENS = 48
KINDS = {"free": {}, "json": {"formtax_strategy": "json", "formtax_answer": "{int}"},
         "inwriting": {"formtax_strategy": "inwriting", "formtax_answer": "The answer is: {int}"}}


def cumulative(stats: pstats.Stats, needle: str) -> float:
    """Cumulative seconds of the functions whose ``file:function`` contains ``needle`` (the outermost call)."""
    raw = stats.stats  # type: ignore[attr-defined]
    return max((v[3] for (f, _, name), v in raw.items() if needle in f"{f}:{name}"), default=0.0)


def main() -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # profile the engine in this process
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    from formtax.backends.model_files import resolve_model
    from formtax.backends.vllm.plugin import plugin_class

    src = resolve_model(None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        llm = LLM(model=src.path, tokenizer=src.path, dtype="float32", enforce_eager=True, block_size=32,
                  enable_chunked_prefill=False, async_scheduling=False, max_model_len=4096,
                  logits_processors=[plugin_class()])
    prompts = [[{"role": "user", "content": PROMPTS[k % len(PROMPTS)]}] for k in range(ROWS)]
    llm.chat(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)  # warm up
    for kind, xargs in KINDS.items():
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, extra_args=dict(xargs) or None)
        prof = cProfile.Profile()
        t = time.perf_counter()
        prof.enable()
        outs = llm.chat(prompts, params, use_tqdm=False)
        prof.disable()
        wall = time.perf_counter() - t
        st = pstats.Stats(prof)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        apply_s = cumulative(st, "logits_processor.py:apply")
        print(json.dumps({"kind": kind, "rows": ROWS, "tokens": tokens, "wall_s": round(wall, 2),
                          "tokens_per_s": round(tokens / wall, 1),
                          "plugin_apply_s": round(apply_s, 2),
                          "mask_fill_s": round(cumulative(st, "fill_masks"), 2),
                          "row_edit_s": round(cumulative(st, "logits_processor.py:edit"), 2),
                          "apply_entries_s": round(cumulative(st, "apply_entries"), 2),
                          "catch_up_s": round(cumulative(st, "logits_processor.py:catch_up"), 2),
                          "model_forward_s": round(cumulative(st, "execute_model"), 2)}), flush=True)


if __name__ == "__main__":
    main()
