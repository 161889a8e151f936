#!/usr/bin/env bash
# Generate the Python code for proto/ into core/busmq/v1 (committed), or with --check,
# fail if the committed code is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
out=core
if [ "${1:-}" = "--check" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out/busmq/v1"
$PY -m grpc_tools.protoc -I proto \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  proto/busmq/v1/*.proto
if [ "${1:-}" = "--check" ]; then
  for f in "$out"/busmq/v1/*.py "$out"/busmq/v1/*.pyi; do
    if ! cmp -s "$f" "core/busmq/v1/$(basename "$f")"; then
      echo "generated code is stale: core/busmq/v1/$(basename "$f") (run scripts/gen_proto.sh)" >&2
      exit 1
    fi
  done
  echo "generated code is fresh"
fi
