#!/usr/bin/env bash
# Generate the code for proto/ (committed): Python into core/busmq/v1, TypeScript into
# clients/typescript/src/gen (with clients/typescript/node_modules installed: npm ci).
# With --check, fail if the committed code is stale.
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

# TypeScript (connect-es): buf with the protoc-gen-es plugin the package pins.
ts=clients/typescript
if [ "${1:-}" = "--check" ]; then
  ts_out=$(mktemp -d)
  (cd "$ts" && ../../.venv/bin/buf generate -o "$ts_out")
  if ! diff -r "$ts/src/gen" "$ts_out/src/gen" >/dev/null; then
    rm -rf "$ts_out"
    echo "generated code is stale: $ts/src/gen (run scripts/gen_proto.sh)" >&2
    exit 1
  fi
  rm -rf "$ts_out"
  echo "generated TypeScript is fresh"
else
  (cd "$ts" && ../../.venv/bin/buf generate)
fi
