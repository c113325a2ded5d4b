"""The long fuzz profile (issue 12): random logits x every strategy x every spec kind x two tokenizers, at random
budgets and temperatures. Every answer with ``parse_ok=True`` is checked by an oracle that is not the engine (the
``regex`` module, ``jsonschema``, membership, the template's own matcher; Lark answers by llguidance replaying the
bytes on a fresh matcher, the only oracle there is), every oracle call is timed, and every exception is a crash.

    python bench/fuzz.py --outputs 20000          # prints a table per (strategy, kind) and one JSON line

Tokenizers: the fake backend's bytes, and the embedded default's real SmolLM2 tokenizer (49k byte-level BPE) under
random logits. Budgets are drawn per call; a request the strategy refuses before decoding (budget too small for the
answer's reserve) is counted as ``refused``, not as an output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
import warnings
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import jsonschema  # noqa: E402
import regex  # noqa: E402
import torch  # noqa: E402

import formtax  # noqa: E402
from formtax.backends.fake import FakeBackend, FakeBatch, random_logits  # noqa: E402
from formtax.constraints import parse_spec  # noqa: E402
from formtax.constraints.compile import validate_with_engine  # noqa: E402
from formtax.constraints.jsonkeys import repeated_keys  # noqa: E402
from formtax.decoding.engine import Backend  # noqa: E402
from formtax.errors import FormtaxError  # noqa: E402

SPECS: dict[str, list[str]] = {
    "regex": ["regex:[0-9]{1,4}", "regex:(yes|no|maybe)", "regex:[a-z]{3}-[0-9]{2}", "regex:ab*c",
              "regex:(?i)yes|no", "regex:.{1,5}", "regex:(0|[1-9][0-9]*)\\.[0-9]{2}"],
    "json": ['json:{"type":"object","properties":{"a":{"type":"integer","minimum":0,"maximum":50}},"required":["a"],'
             '"additionalProperties":false}',
             'json:{"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"minItems":1,"maxItems":3}',
             'json:{"type":"object","properties":{"p":{"$ref":"#/$defs/P"}},"required":["p"],"additionalProperties":'
             'false,"$defs":{"P":{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"],'
             '"additionalProperties":false}}}',
             'json:{"type":"object","properties":{"s":{"type":"string","maxLength":6}},"required":["s"],'
             '"additionalProperties":false}',
             'json:{"type":"object"}',  # json_object: an open object, where a grammar alone lets keys repeat
             'json:{"type":"object","additionalProperties":{"type":"integer"},"maxProperties":6}'],
    "choice": ["choice:red|green|blue", "choice:a|ab|abc", "choice:yes|no"],
    "lark": ['lark:start: "x" NUM\nNUM: /[0-9]{1,3}/', 'lark:start: ("a" | "b")+ "."'],
    "template": ["The answer is: {int}", "{int:0..999}", "{letters:4}", "Pick {choice:red|green|blue}.",
                 "A={int:-5..5};", "{int:0..9}{int:10..99}", "The answer is: {int:0..999} units"],
    "record": ['record:{"name": "{str:8}", "n": "{int:0..99}"}'],
}
STRATEGIES = ["constrained", "json", "inwriting", "nl2format", "suffix-last", "suffix-beam", "decog"]
KIND_STRATEGIES = {  # the strategies each kind of spec makes sense for (templates / choices: all of them)
    "regex": ["constrained", "json", "inwriting", "nl2format", "suffix-last"],
    "json": ["constrained", "json", "inwriting", "nl2format"],
    "choice": STRATEGIES,
    "lark": ["constrained", "inwriting", "nl2format"],
    "template": STRATEGIES,
    "record": ["constrained", "json", "inwriting"],
}


class RandomBackend(FakeBackend):
    """Random logits over another tokenizer (the fake backend's machinery, the given vocabulary)."""

    def __init__(self, tok: Any, seed: int) -> None:
        super().__init__(None, model_id=f"random-{tok.n_logits}")
        self._tok = tok
        width = tok.n_logits

        def fn(seq: Any) -> torch.Tensor:
            key = hashlib.blake2b(repr((seed, list(seq[-4:]))).encode(), digest_size=8).digest()
            g = torch.Generator().manual_seed(int.from_bytes(key, "little") & ((1 << 63) - 1))
            return torch.randn(width, generator=g) * 3.0

        self.fn = fn

    def new_batch(self, prompts: Any) -> FakeBatch:
        return FakeBatch(self.fn, prompts)


def oracle(kind: str, spec: str, value_text: str) -> bool:
    """Whether an accepted answer's text is in the spec's language, decided without the decoding engine."""
    body = spec.split(":", 1)[1] if kind in ("regex", "json", "choice", "lark", "record") else spec
    if kind == "regex":
        return regex.fullmatch(body, value_text, timeout=5.0) is not None
    if kind == "json":
        try:
            jsonschema.validate(json.loads(value_text), json.loads(body))
            return True
        except (ValueError, jsonschema.ValidationError):
            return False
    if kind == "choice":
        return value_text in body.split("|")
    if kind == "lark":
        return validate_with_engine(parse_spec(spec).grammar, value_text)[0]
    return parse_spec(spec).validate(value_text).ok  # templates and records: their own matchers (not the engine)


def answer_of(strategy: str, kind: str, r: Any) -> str:
    if strategy == "json":
        inner = json.loads(r.answer_text)["answer"]
        return inner if isinstance(inner, str) and kind not in ("json", "record") else json.dumps(inner, ensure_ascii=False)
    return r.answer_text


def fem_for(backend: Backend, tmp: Path) -> str:
    from formtax.fem.artifact import save_fem
    from formtax.fem.hmm import HMM

    path = tmp / f"fem-{backend.tokenizer.n_logits}.npz"
    if not path.is_file():
        save_fem(path, HMM.random(8, backend.tokenizer.n_logits, seed=0),
                 {"form": "instruction-aware", "tokenizer_sha256": backend.tokenizer.engine.key,
                  "model": backend.model_id, "task": "fuzz"})
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--outputs", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smollm2-share", type=float, default=0.25, help="share of calls on the real tokenizer")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    rng = random.Random(a.seed)
    import tempfile

    from formtax.planted.backend import planted_tokenizer

    tmp = Path(tempfile.mkdtemp())
    real_tok = planted_tokenizer("smollm2")
    counts: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    slowest = 0.0
    crashes: list[str] = []
    n = 0
    t_start = time.perf_counter()
    while n < a.outputs:
        kind = rng.choice(list(SPECS))
        spec = rng.choice(SPECS[kind])
        strategy = rng.choice(KIND_STRATEGIES[kind])
        real = rng.random() < a.smollm2_share
        seed = rng.randrange(1 << 30)
        backend = RandomBackend(real_tok, seed) if real else FakeBackend(random_logits(seed=seed))
        budget = rng.choice([8, 16, 32, 64, 96, 160])
        temperature = rng.choice([0.0, 0.0, 0.7, 1.0])
        kw: dict[str, Any] = {"max_tokens": budget, "temperature": temperature, "seed": seed}
        c = counts[(strategy, kind)]
        try:
            if strategy == "decog":
                opts = {"fem": fem_for(backend, tmp)}
                strat = formtax.strategies.get_strategy("decog")
                req = formtax.strategies.Request([{"role": "user", "content": "q"}], parse_spec(spec),
                                                 max_tokens=budget, temperature=temperature, seed=seed, options=opts)
                (r,) = strat.run(backend, [req])
            else:
                r = formtax.generate(backend, "q", strategy, spec, closing=False, **kw)  # incomplete answers too
        except FormtaxError as e:
            c["refused"] += 1
            if "cannot fit" not in str(e) and "needs" not in str(e):
                c["refused_other"] += 1
            continue
        except Exception as e:  # a crash
            crashes.append(f"{strategy} {spec!r} budget={budget} T={temperature} seed={seed}: {type(e).__name__}: {e}")
            c["crash"] += 1
            n += 1
            continue
        n += 1
        c["outputs"] += 1
        c["real_tokenizer"] += int(real)
        if kind in ("json", "record") and r.answer_text:
            c["duplicate_keys"] += repeated_keys(r.answer_text)  # whole or cut short: never a repeated key
        if r.parse_ok:
            c["parse_ok"] += 1
            t1 = time.perf_counter()
            ok = oracle(kind, spec, answer_of(strategy, kind, r))
            slowest = max(slowest, time.perf_counter() - t1)
            if not ok:
                c["accepted_invalid"] += 1
                crashes.append(f"ACCEPTED-INVALID {strategy} {spec!r} seed={seed}: {r.answer_text!r}")
        else:
            c[f"unparsed:{r.finish_reason}"] += 1
        if n % 1000 == 0:
            print(f"{n} outputs, {time.perf_counter() - t_start:.0f} s", file=sys.stderr, flush=True)
    print("| strategy | kind | outputs | parse_ok | accepted-invalid | duplicate keys | crashes | refused | "
          "unparsed (finish) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (strategy, kind), c in sorted(counts.items()):
        unparsed = ", ".join(f"{k.split(':', 1)[1]} {v}" for k, v in sorted(c.items()) if k.startswith("unparsed:"))
        print(f"| {strategy} | {kind} | {c['outputs']} | {c['parse_ok']} | {c['accepted_invalid']} | "
              f"{c['duplicate_keys']} | {c['crash']} | "
              f"{c['refused']} | {unparsed} |")
    for line in crashes[:20]:
        print(line)
    total = Counter[str]()
    for c in counts.values():
        total.update(c)
    print(json.dumps({"bench": "fuzz", "outputs": n, "accepted_invalid": total["accepted_invalid"],
                      "crashes": total["crash"], "duplicate_keys": total["duplicate_keys"], "parse_ok": total["parse_ok"], "refused": total["refused"],
                      "slowest_oracle_s": round(slowest, 4), "wall_s": round(time.perf_counter() - t_start, 1),
                      "ratio": total["accepted_invalid"] + total["crash"] + total["duplicate_keys"], "target": 0, "better": "lower"}))


if __name__ == "__main__":
    main()
