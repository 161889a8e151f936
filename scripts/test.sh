#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run lint, type checks and the whole test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -k queue -x
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "==> ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "==> mypy --strict"
.venv/bin/mypy
echo "==> pytest"
.venv/bin/pytest "$@"
