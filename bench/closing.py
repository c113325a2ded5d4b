"""Closing mode's fuzz (issue 20): random-logit decodes over open JSON schemas, free-string regexes and Lark
grammars at tight budgets, on two tokenizers, with closing on and, for the same requests, off.

    python bench/closing.py --outputs 3000      # a table per (strategy, kind), then one JSON line

``time_ratio_closing_vs_off`` is over the random-logit fake models (whose forward pass costs nothing, so it is
closing's bookkeeping alone); ``model_time_ratio`` is the same comparison on the embedded default model, greedy,
at budgets that do not bind (the outputs must then be token-identical, ``model_outputs_identical``).

Each request's budget is drawn around the answer's shortest known completion (the start witness, in tokens of
that tokenizer): from 3 below it to 24 above. With closing on, a request whose budget is below the witness must
be refused up front ("no completion fits") and every other one must parse and pass the oracle (``regex``,
``jsonschema``, a fresh engine replay for Lark); the JSON line's ``ratio`` counts the failures (target 0). The
same request with closing off shows how many would have run out of budget.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz import RandomBackend, answer_of, oracle  # noqa: E402

import formtax  # noqa: E402
from formtax.backends.fake import FakeBackend, random_logits  # noqa: E402
from formtax.constraints import parse_spec  # noqa: E402
from formtax.constraints.closing import start_witness  # noqa: E402
from formtax.constraints.compile import compile_grammar  # noqa: E402
from formtax.errors import FormtaxError  # noqa: E402

SPECS: dict[str, list[str]] = {
    "json": ['json:{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"array","items":'
             '{"type":"integer"}}},"required":["a","b"]}',
             'json:{"type":"object","properties":{"name":{"type":"string"},"tags":{"type":"array","items":'
             '{"type":"string"},"minItems":1}},"required":["name","tags"]}',
             'json:{"type":"object","properties":{"p":{"type":"object","properties":{"q":{"type":"string",'
             '"minLength":2}},"required":["q"]}},"required":["p"],"additionalProperties":false}',
             'json:{"type":"array","items":{"type":"object","properties":{"x":{"type":"number"}},"required":["x"]}}'],
    "regex": ["regex:[a-z]+ ok", r"regex:(\w+ )*end\.", "regex:[A-Z][a-z]* (said|asked) [a-z ]+[.?]",
              "regex:.+!"],
    "lark": ['lark:start: "(" item ("," item)* ")"\nitem: /[a-z]+/ | start',
             'lark:start: sentence+\nsentence: /[A-Za-z ]+/ "."'],
}
STRATEGIES = {"json": ["constrained", "inwriting", "nl2format"],
              "regex": ["constrained", "json", "inwriting", "nl2format"],
              "lark": ["constrained", "inwriting", "nl2format"]}


def answer_limit(strategy: str, spec: str, budget: int, backend: Any) -> tuple[str, int]:
    """The constraint closing works on and the budget its answer call gets: the strategy's own
    ``closing_target`` (json's whole object, InWriting's answer reserve, NL-to-Format's second call)."""
    from formtax.strategies import get_strategy
    from formtax.strategies.base import Request

    target = get_strategy(strategy).closing_target(backend, Request("q", parse_spec(spec), max_tokens=budget,
                                                                    closing=True))
    assert target is not None
    return target[0].grammar, target[1]


def model_overhead(repeats: int) -> dict[str, Any]:
    """Closing mode's cost on the embedded default model: the same greedy requests with closing on and off, side
    by side, repeated; the median of the per-repeat time ratios, and whether the outputs were identical (the
    budgets do not bind, so closing must change nothing)."""
    import statistics

    m = formtax.load_model()
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "city": {"type": "string"}}, "required": ["name", "age", "city"],
              "additionalProperties": False}
    jobs = [("constrained", schema, 80), ("inwriting", "The answer is: {int}", 96),
            ("constrained", "regex:[A-Z][a-z]+( [a-z]+)*\\.", 48)]
    prompts = ["Describe a person as JSON.", "Tom has 3 apples and buys 4 more. How many?",
               "Write one sentence about the sea."]
    ratios, same = [], True
    for _ in range(repeats):
        t = {True: 0.0, False: 0.0}
        for (strategy, answer, budget), q in zip(jobs, prompts, strict=True):
            out = {}
            for closing in (False, True):
                t0 = time.perf_counter()
                out[closing] = formtax.generate(m, q, strategy, answer, max_tokens=budget, closing=closing)
                t[closing] += time.perf_counter() - t0
            if out[False].finish_reason != "length-incomplete":  # where the budget does not bind
                same = same and out[True].token_ids == out[False].token_ids
        ratios.append(t[True] / t[False])
    return {"model_time_ratio": round(statistics.median(ratios), 3), "model_ratios": [round(r, 3) for r in ratios],
            "model_outputs_identical": same}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--outputs", type=int, default=3000)
    ap.add_argument("--model-repeats", type=int, default=5,
                    help="repeats of the default-model overhead measurement (0: skip it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smollm2-share", type=float, default=0.3)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    rng = random.Random(a.seed)
    from formtax.planted.backend import planted_tokenizer

    real_tok = planted_tokenizer("smollm2")
    counts: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    failures: list[str] = []
    n = 0
    t0 = time.perf_counter()
    wall = {"on": 0.0, "off": 0.0}
    while n < a.outputs:
        kind = rng.choice(list(SPECS))
        spec = rng.choice(SPECS[kind])
        strategy = rng.choice(STRATEGIES[kind])
        real = rng.random() < a.smollm2_share
        seed = rng.randrange(1 << 30)

        def backend(real: bool = real, seed: int = seed) -> Any:
            return RandomBackend(real_tok, seed) if real else FakeBackend(random_logits(seed=seed))

        tok = backend().tokenizer
        if strategy == "constrained":  # around the shortest completion
            w0 = start_witness(compile_grammar(parse_spec(spec).grammar, tok.engine), tok.n_logits)
            budget = max(1, (len(w0) if w0 is not None else 64) + rng.randint(-3, 24))
        elif strategy == "json":  # just above json's own minimum (its scaffold and the answer's reserve)
            budget = rng.randint(150, 200)
        else:  # the answer call gets the reserve, 65 tokens, whatever the budget
            budget = rng.randint(70, 120)
        temperature = rng.choice([0.0, 0.0, 0.7, 1.0])
        kw: dict[str, Any] = {"max_tokens": budget, "temperature": temperature, "seed": seed, "raw": True}
        c = counts[(strategy, kind)]
        grammar, limit = answer_limit(strategy, spec, budget, backend())
        w = start_witness(compile_grammar(grammar, tok.engine), tok.n_logits)
        fits = w is not None and len(w) <= limit
        t1 = time.perf_counter()
        try:
            r = formtax.generate(backend(), "q", strategy, spec, **kw)
        except FormtaxError as e:
            wall["on"] += time.perf_counter() - t1
            if "closing mode" in str(e):
                c["refused_no_completion"] += 1
                if fits:
                    c["failure"] += 1
                    failures.append(f"REFUSED-BUT-FITS {strategy} {spec!r} budget={budget}")
            else:
                c["refused_budget"] += 1  # below the strategy's own minimum (e.g. json's scaffold)
            continue
        except Exception as e:  # a crash
            c["failure"] += 1
            failures.append(f"CRASH {strategy} {spec!r} budget={budget} seed={seed}: {type(e).__name__}: {e}")
            n += 1
            continue
        wall["on"] += time.perf_counter() - t1
        n += 1
        c["outputs"] += 1
        c["real_tokenizer"] += int(real)
        if r.parse_ok and oracle(kind, spec, answer_of(strategy, kind, r)):
            c["parse_ok"] += 1
        else:
            c["failure"] += 1
            failures.append(f"UNPARSED {strategy} {spec!r} budget={budget} seed={seed} T={temperature}: "
                            f"{r.finish_reason} {r.answer_text!r}")
        t1 = time.perf_counter()
        try:  # without closing a strategy reserves the worst case, so a budget closing runs may be refused
            off = formtax.generate(backend(), "q", strategy, spec, closing=False, **kw)
            c["off_parse_ok"] += int(off.parse_ok)
        except FormtaxError:
            c["off_refused"] += 1
        wall["off"] += time.perf_counter() - t1
        if n % 500 == 0:
            print(f"{n} outputs, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    print("| strategy | kind | outputs | parse ok (closing) | parse ok (no closing) | refused without closing | "
          "refused: no completion fits | failures |")
    print("|---|---|---|---|---|---|---|---|")
    total = Counter[str]()
    for (strategy, kind), c in sorted(counts.items()):
        total.update(c)
        print(f"| {strategy} | {kind} | {c['outputs']} | {c['parse_ok']} | {c['off_parse_ok']} | "
              f"{c['off_refused']} | {c['refused_no_completion']} | {c['failure']} |")
    for line in failures[:20]:
        print(line)
    extra = model_overhead(a.model_repeats) if a.model_repeats > 0 else {}
    print(json.dumps({"bench": "closing", "outputs": n, "parse_ok": total["parse_ok"],
                      "parse_ok_without_closing": total["off_parse_ok"], "refused_without_closing": total["off_refused"],
                      "refused_no_completion": total["refused_no_completion"], "failures": total["failure"],
                      "time_ratio_closing_vs_off": round(wall["on"] / max(wall["off"], 1e-9), 3),
                      "wall_s": round(time.perf_counter() - t0, 1),
                      **extra, "ratio": total["failure"], "target": 0, "better": "lower"}))


if __name__ == "__main__":
    main()
