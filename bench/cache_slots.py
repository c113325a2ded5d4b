"""Rows joining and leaving a running batch (issue 44): dead slots and lazy compaction vs a copy per leave and join.

The continuous decode loop (``decode(admit=...)``, formtax serve's batching) on the default model (SmolLM2-135M,
CPU, greedy): 48 free rows with budgets from 8 to 96 tokens, at most 16 live, each finished row replaced by a
queued one at the next step. ``hf.COMPACT_AT = 0`` compacts the cache at every leave and joins by building a new
cache of all rows (the behaviour before slots); the default keeps finished rows as dead slots until they are half
the batch and puts joining rows into them. The two run alternately, ``REPEAT`` times each; the ratio is the
median wall time of the default over the median of the copy-per-leave form (lower is better; target <= 1.0). The
outputs are checked equal.

    python bench/cache_slots.py          # about 3 minutes on 2 cores
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from _common import PROMPTS, finish, load_default

ROWS = 48
LIVE = 16
REPEAT = 3


def run(backend: Any) -> tuple[float, list[list[int]]]:
    from formtax.decoding.loop import RowRequest, decode
    from formtax.decoding.policies import FreePolicy

    tok = backend.tokenizer
    budgets = [8 + (k * 37) % 89 for k in range(ROWS)]
    rows = [RowRequest(tok.prompt_ids([{"role": "user", "content": PROMPTS[k % len(PROMPTS)]}]),
                       FreePolicy(frozenset()), budgets[k]) for k in range(ROWS)]  # no EOS: each row runs its budget
    queue = list(rows[LIVE:])

    def admit(n_live: int) -> list[RowRequest]:
        take = queue[: max(0, LIVE - n_live)]
        del queue[: len(take)]
        return take

    t = time.perf_counter()
    outs = decode(backend, rows[:LIVE], admit=admit)
    return time.perf_counter() - t, [o.tokens for o in outs]


def main() -> None:
    from formtax.backends import hf

    backend = load_default()
    default = hf.COMPACT_AT
    times: dict[str, list[float]] = {"slots": [], "copy": []}
    outputs: dict[str, list[list[int]]] = {}
    run(backend)  # warm up
    for _ in range(REPEAT):
        for name, at in (("copy", 0.0), ("slots", default)):
            hf.COMPACT_AT = at
            wall, outputs[name] = run(backend)
            times[name].append(wall)
    hf.COMPACT_AT = default
    assert outputs["slots"] == outputs["copy"], "the outputs differ"
    slots, copy = statistics.median(times["slots"]), statistics.median(times["copy"])
    finish({"bench": "cache_slots", "ratio": round(slots / copy, 3), "target": 1.0, "better": "lower",
            "slots_s": [round(t, 2) for t in times["slots"]], "copy_s": [round(t, 2) for t in times["copy"]],
            "rows": ROWS, "live": LIVE, "compact_at": default})


if __name__ == "__main__":
    main()
