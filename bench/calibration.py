"""The long calibration: coverage of every interval type over many synthetic studies of the built-in worlds,
sampled at temperature 1, and McNemar's p-values on a null pair (KS statistic). One JSON line per world.

    python bench/calibration.py --studies 400 --items 40 --seeds 3
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from formtax.planted.backend import PlantedBackend
from formtax.planted.calibrate import coverage_study, study_config
from formtax.planted.task import planted_task
from formtax.planted.truth import grid_truth
from formtax.planted.world import load_world, write_world
from formtax.planted.worlds import BUILTIN

SAMPLED = {"abstention": (["free", "short", "constrained"], "constrained"),
           "reasoning-rc": (["inwriting@vc", "inwriting@vc+rc"], "inwriting@vc")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--studies", type=int, default=400)
    ap.add_argument("--items", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--replicates", type=int, default=2000)
    ap.add_argument("--tokenizer", default="bytes", choices=["bytes", "smollm2"])
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    for name, (strategies, null) in SAMPLED.items():
        path = write_world(BUILTIN[name](n_items=200, tokenizer=a.tokenizer), tmp / f"{name}.json")
        w = load_world(path)
        g = grid_truth(PlantedBackend(w, str(path)), planted_task(w, str(path)),
                       study_config(w, path, strategies, temperature=1.0))
        cov = coverage_study(g, a.studies, a.items, a.seeds, a.replicates, null_of=null)
        print(json.dumps({"world": name, "studies": a.studies, "items": a.items, "seeds": a.seeds,
                          "coverage": {k: round(v["coverage"], 4) for k, v in cov.by_type.items()},
                          "target": [0.93, 0.97], "mcnemar_ks": cov.mcnemar_ks, "mcnemar_ks_p": cov.mcnemar_ks_p,
                          "mcnemar_reject_05": cov.mcnemar_reject_05, "unresolved": g.max_unresolved}), flush=True)


if __name__ == "__main__":
    main()
