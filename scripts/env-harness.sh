#!/usr/bin/env bash
# Create (once) and update a third virtualenv, .venv-harness (or $HARNESS_VENV), holding an evaluation harness that
# speaks the OpenAI API: inspect_ai with its openai-api provider. tests/serve/test_harness.py runs it against a live
# `formtax serve` (issue 39: a harness as a client, with no custom fields). Separate so that the harness's own pins
# never move the main .venv's. Measured here: about 1 min on a fresh venv; safe to run again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=${HARNESS_VENV:-.venv-harness}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "inspect-ai==0.3.285" "openai==3.60.0"
