#!/usr/bin/env bash
# The test suite (what CI runs): installs into .venv, then pytest; then, with FORMTAX_WITH_VLLM=1 (and no
# arguments), the vLLM and Ray tests in their own venv, .venv-vllm (scripts/env-vllm.sh). That second step is
# opt-in until it has been timed on a clean CI machine (see the closing note of the scale-out issue).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
python -m pytest -q "$@"
if [ $# -eq 0 ] && [ "${FORMTAX_WITH_VLLM:-0}" = "1" ]; then
  bash scripts/env-vllm.sh
  "${VLLM_VENV:-.venv-vllm}/bin/python" -m pytest -q -m "vllm or parallel" tests/vllm tests/parallel
fi
