#!/usr/bin/env bash
# The main job on the embedded default model (SmolLM2-135M-Instruct): an evaluation run of the base strategies
# on the synthetic arithmetic task, then the report and its verification. Re-running resumes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
OUT=${OUT:-runs/arith-default}
START=$(date +%s)
# Batch 16: each strategy's 16 items decode together. On CPU a step streams the model's weights once for the whole
# batch, so 16 rows cost about 1.2x what 8 do (bench/run_throughput.py measures the batch-size effect).
formtax run --task arith --strategies free,short,constrained,json,inwriting,nl2format,inwriting+rc \
  --limit "${LIMIT:-16}" --max-tokens 192 --batch-size "${BATCH_SIZE:-16}" --out "$OUT"
formtax report "$OUT"
formtax verify "$OUT"
echo "report: $OUT/report.md (and report.html); $(( $(date +%s) - START )) s in all (per-cell timing: tables/timing.csv)"
