#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run every check and the whole test suite:
# ruff, mypy --strict, buf lint/format/breaking (against the released API), generated-code freshness, hadolint,
# pytest (on two workers, with branch coverage), and the TypeScript and Go clients' suites.
# Extra arguments go to pytest (and skip the client suite), e.g. scripts/test.sh -k queue -x.
# Prints the 25 slowest tests, the branch coverage and the time of each tier at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/tiers.sh
BIN="${VENV:-.venv}/bin"
# pytest-xdist workers: the tests mostly wait on servers and the network, so two workers
# nearly halve the time on two cores (BUSMQ_TEST_WORKERS=0 runs them in this process).
WORKERS="${BUSMQ_TEST_WORKERS:-2}"

checks() {
  echo "==> ruff"
  $BIN/ruff check .
  $BIN/ruff format --check .
  echo "==> mypy --strict"
  $BIN/mypy
  echo "==> buf lint, format, breaking (against the released API, proto/released-api.json)"
  $BIN/buf lint
  $BIN/buf format --exit-code >/dev/null || { echo "proto files need 'buf format -w'" >&2; exit 1; }
  # The image of the last released API, committed: a break must be made on purpose, by
  # writing it anew (buf build --exclude-source-info -o proto/released-api.json) with a note.
  $BIN/buf breaking --against proto/released-api.json
  echo "==> generated code"
  bash scripts/gen_proto.sh --check
  echo "==> hadolint"
  $BIN/hadolint Dockerfile
}

# Each client suite takes one to two minutes beside pytest. A suite still running after
# CLIENT_SUITE_SECONDS has hung (node's test runner has no timeout of its own): it is
# stopped and fails, and its output so far shows where.
CLIENT_SUITE_SECONDS="${CLIENT_SUITE_SECONDS:-600}"

typescript() {
  echo "==> TypeScript client (tsc, node --test against a live gateway)"
  (cd clients/typescript && timeout -k 15 "$CLIENT_SUITE_SECONDS" npm test --silent) \
    || { status=$?; [ "$status" -ne 124 ] || echo "TypeScript client: stopped after ${CLIENT_SUITE_SECONDS}s"; return "$status"; }
}

go_client() {
  echo "==> Go client (gofmt, go vet, go test against a live gateway)"
  timeout -k 15 "$CLIENT_SUITE_SECONDS" bash clients/go/test.sh \
    || { status=$?; [ "$status" -ne 124 ] || echo "Go client: stopped after ${CLIENT_SUITE_SECONDS}s"; return "$status"; }
}

tier "setup" bash scripts/setup.sh --dev
if [ $# -eq 0 ]; then
  # Beside pytest: each mostly waits (on a gateway, on the compiler's files), as most
  # tests do; their output follows pytest's.
  tier_start "checks" checks
  tier_start "TypeScript client" typescript
  tier_start "Go client" go_client
else
  tier "checks" checks
fi
echo "==> pytest (on $WORKERS workers; branch coverage of busmq and busmq_gateway)"
failed=0
tier "pytest ($($BIN/python -c 'import sys; print("%d.%d" % sys.version_info[:2])'))" \
  $BIN/pytest -n "$WORKERS" --dist loadgroup --cov --cov-report= --durations=25 "$@" || failed=1
echo "branch coverage (in-process; coverage.py, .coverage): $($BIN/coverage report --format=total)%"
tiers_wait || failed=1
tier_times
exit "$failed"
