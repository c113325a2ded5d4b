#!/usr/bin/env bash
# Create (once) and update a venv, .venv-agents (or $AGENTS_VENV), holding the agent frameworks that
# tests/serve/test_agents.py drives against a live `formtax serve` (issue 59): the OpenAI Agents SDK and DSPy.
# Separate from .venv so that their pins (litellm, openai) never move the main venv's, as scripts/env-harness.sh
# keeps inspect_ai apart. Also installs the Vercel AI SDK (npm: ai, @ai-sdk/openai-compatible, zod) into
# tests/serve/clients/node_modules when node and npm are present (skipped with a message otherwise).
# Safe to run again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=${AGENTS_VENV:-.venv-agents}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "openai-agents==0.24.0" "dspy==3.4.1" "pydantic>=2.10"
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  (cd tests/serve/clients && npm ci --no-audit --no-fund --silent)
else
  echo "env-agents: node/npm not found; the AI SDK test will skip" >&2
fi
