#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run every check and the whole test suite:
# ruff, mypy --strict, buf lint/format/breaking, generated-code freshness, hadolint,
# pytest, and the TypeScript and Go clients' suites. Extra arguments go to pytest (and skip the
# client suite), e.g. scripts/test.sh -k queue -x
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
BIN=.venv/bin
echo "==> ruff"
$BIN/ruff check .
$BIN/ruff format --check .
echo "==> mypy --strict"
$BIN/mypy
echo "==> buf lint, format, breaking (against main)"
$BIN/buf lint
$BIN/buf format --exit-code >/dev/null || { echo "proto files need 'buf format -w'" >&2; exit 1; }
if git rev-parse --verify -q main >/dev/null; then
  $BIN/buf breaking --against '.git#branch=main'
fi
echo "==> generated code"
bash scripts/gen_proto.sh --check
echo "==> hadolint"
$BIN/hadolint Dockerfile
if [ $# -eq 0 ]; then
  echo "==> TypeScript client (tsc, node --test against a live gateway)"
  (cd clients/typescript && npm test --silent)
  echo "==> Go client (gofmt, go vet, go test against a live gateway)"
  bash clients/go/test.sh
fi
echo "==> pytest"
$BIN/pytest "$@"
