#!/usr/bin/env bash
# The test suite (what CI runs): installs into .venv, then pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/env.sh
python -m pytest -q "$@"
