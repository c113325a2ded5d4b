"""Issue 58: a hopeless closing budget is refused at once, whatever the schema's size. 1,000 and 3,000 required
string properties (anchored and unanchored patterns) at max_tokens 16 on the fake backend; each refusal timed cold (a
schema no earlier request used; the median of 3, after one warm-up request), the slowest reported.

    python bench/closing_refusal.py        # one JSON line: ratio = the slowest refusal in seconds, target 1.0
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import formtax  # noqa: E402
from formtax.backends.fake import FakeBackend, random_logits  # noqa: E402
from formtax.errors import FormtaxError  # noqa: E402


def schema(n: int, pattern: str, rep: int) -> dict:
    """A schema no earlier request used (its names carry ``rep``), so no cache answers for it."""
    return {"type": "object", "required": [f"r{rep}k{i}" for i in range(n)],
            "properties": {f"r{rep}k{i}": {"type": "string", "pattern": pattern} for i in range(n)}}


def main() -> None:
    backend = FakeBackend(random_logits())
    formtax.generate(backend, "q", "constrained", {"type": "object", "properties": {"a": {"type": "integer"}},
                                                   "required": ["a"]}, max_tokens=16)  # warm-up
    rows = {}
    for n in (1000, 3000):
        for pattern in ("^[a-z]{3,40}$", "[a-z]{3,40}"):
            times = []
            for rep in range(3):
                t0 = time.perf_counter()
                try:
                    formtax.generate(backend, "q", "constrained", schema(n, pattern, rep), max_tokens=16)
                    raise SystemExit(f"{n} properties at 16 tokens were not refused")
                except FormtaxError:
                    times.append(time.perf_counter() - t0)
            rows[f"{n}/{'anchored' if pattern.startswith('^') else 'unanchored'}"] = round(statistics.median(times), 3)
            print(n, pattern, rows[list(rows)[-1]], "s", file=sys.stderr)
    print(json.dumps({"bench": "closing_refusal", "seconds": rows, "ratio": max(rows.values()), "target": 1.0,
                      "better": "lower"}))


if __name__ == "__main__":
    main()
