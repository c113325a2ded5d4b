"""Closing mode's reach (issue 58): over the vendored JSON-Schema-Test-Suite, how short the start witness is and
whether every request whose answer fits completes.

    python bench/closing_reach.py                    # byte tokenizer (the fake backend), one JSON line
    python bench/closing_reach.py --real             # also SmolLM2's 49k tokenizer with random logits

For every compiled schema with a valid instance (the grammar admits it and the oracle accepts it; the shortest one,
laid out as the grammar writes JSON): the start witness's length against that instance's tokens (``excess``: witness
minus instance, median and max; negative where the witness is shorter), then one closing request with random logits
at budget = instance's tokens + 2, timed. ``refused_where_fits`` counts requests refused although the instance fits
(target 0); ``unparsed`` requests that finished without a parse (``unparsed_flagged``: of those, the ones closing had
flagged ``closing_parse: grammar-only`` before decoding). ``p95_s``: the 95th percentile of the per-request time.
``hopeless_s``: the time to refuse 1,000 and 3,000 required properties at 16 tokens (anchored and not).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from _common import finish

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "core"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import formtax  # noqa: E402
from formtax.backends.fake import FakeBackend, random_logits  # noqa: E402
from formtax.constraints.closing import start_witness  # noqa: E402
from formtax.constraints.compile import compile_grammar  # noqa: E402
from formtax.constraints.spec import JsonConstraint  # noqa: E402
from formtax.errors import ConfigError  # noqa: E402


def cases() -> list[tuple[str, dict[str, Any], str]]:
    from test_closing_reach import suite_cases

    return suite_cases()


def run(make: Any, label: str) -> dict[str, Any]:
    tok = make(0).tokenizer
    excess, times, refused, unparsed, flagged, failures = [], [], 0, 0, 0, []
    for k, (where, schema, instance) in enumerate(cases()):
        n = len(tok.encode(instance))
        c = JsonConstraint(schema)
        w = start_witness(compile_grammar(c.grammar, tok.engine), tok.n_logits)
        if w is not None:
            excess.append(len(w) - n)
        t0 = time.perf_counter()
        try:
            r = formtax.generate(make(k), "q", "constrained", schema, max_tokens=n + 2, raw=True)
        except ConfigError as e:
            refused += 1
            failures.append(f"REFUSED {where} at {n + 2}: {e}")
            continue
        finally:
            times.append(time.perf_counter() - t0)
        if not r.parse_ok:
            unparsed += 1
            flagged += int(r.stats.get("closing_parse") == "grammar-only")
            failures.append(f"UNPARSED {where}: {r.answer_text!r} {r.stats.get('closing_parse')}")
    for line in failures[:15]:
        print(label, line)
    times.sort()
    return {f"{label}_schemas": len(times), f"{label}_refused_where_fits": refused, f"{label}_unparsed": unparsed,
            f"{label}_unparsed_flagged": flagged,
            f"{label}_excess_median": statistics.median(excess) if excess else None,
            f"{label}_excess_max": max(excess) if excess else None,
            f"{label}_p95_s": round(times[int(0.95 * (len(times) - 1))], 4), f"{label}_max_s": round(times[-1], 4)}


def hopeless() -> dict[str, float]:
    out = {}
    for n in (1000, 3000):
        for anchored in (True, False):
            pattern = "^[a-z]{3,40}$" if anchored else "[a-z]{3,40}"
            schema = {"type": "object", "required": [f"p{i}" for i in range(n)],
                      "properties": {f"p{i}": {"type": "string", "pattern": pattern} for i in range(n)}}
            t0 = time.perf_counter()
            try:
                formtax.generate(FakeBackend(random_logits(seed=0)), "q", "constrained", schema, max_tokens=16)
                raise AssertionError("a hopeless budget was not refused")
            except ConfigError:
                pass
            out[f"hopeless_{n}_{'anchored' if anchored else 'unanchored'}_s"] = round(time.perf_counter() - t0, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", action="store_true", help="also SmolLM2's tokenizer (random logits)")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    result = run(lambda s: FakeBackend(random_logits(seed=s)), "bytes")
    if a.real:
        from fuzz import RandomBackend

        from formtax.planted.backend import planted_tokenizer

        real = planted_tokenizer("smollm2")
        result |= run(lambda s: RandomBackend(real, s), "smollm2")
    result |= hopeless()
    failures = sum(v for k, v in result.items() if k.endswith("refused_where_fits"))
    finish({"bench": "closing_reach", **result, "ratio": failures, "target": 0, "better": "lower"})


if __name__ == "__main__":
    main()
