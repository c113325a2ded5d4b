"""The same 48-request arith run with --batch-size 8 vs --batch-size 1 on the default model.

ratio = throughput at batch 8 / throughput at batch 1 (target >= 3). Also: how many greedy outputs differ between
the two (left padding can change floating point; the records say which batch size produced them).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from _common import finish, load_default

from formtax.runner import RunConfig, run


def main() -> None:
    m = load_default()
    cfg = dict(task="arith", strategies=["free", "constrained", "inwriting"], limit=16, max_tokens=96)
    texts = {}
    times = {}
    for bs in (8, 1):
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            run(RunConfig(**cfg, batch_size=bs), Path(d), backend=m)  # type: ignore[arg-type]
            times[bs] = time.perf_counter() - t
            recs = [json.loads(x) for x in (Path(d) / "records.jsonl").read_text().splitlines()]
            texts[bs] = {r["request_id"]: r["text"] for r in recs}
    differ = sum(1 for k in texts[1] if texts[1][k] != texts[8].get(k))
    finish({"ratio": round(times[1] / times[8], 3), "target": 3.0, "better": "higher", "requests": len(texts[1]),
            "wall_s_batch1": round(times[1], 1), "wall_s_batch8": round(times[8], 1), "outputs_differing": differ})


if __name__ == "__main__":
    main()
