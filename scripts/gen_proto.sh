#!/usr/bin/env bash
# Generate the code for proto/ (committed): Python into core/busmq/v1, TypeScript into
# clients/typescript/src/gen (with clients/typescript/node_modules installed: npm ci),
# Go into clients/go/gen (with Debian's protoc-gen-go and protoc-gen-go-grpc).
# With --check, fail if the committed code is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
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

# TypeScript (connect-es) and Go: buf with each client's buf.gen.yaml.
for client in clients/typescript clients/go; do
  if [ "${1:-}" = "--check" ]; then
    fresh=$(mktemp -d)
    (cd "$client" && "../../$VENV/bin/buf" generate -o "$fresh")
    gen=gen
    [ -d "$client/src/gen" ] && gen=src/gen
    if ! diff -r "$client/$gen" "$fresh/$gen" >/dev/null; then
      rm -rf "$fresh"
      echo "generated code is stale: $client/$gen (run scripts/gen_proto.sh)" >&2
      exit 1
    fi
    rm -rf "$fresh"
    echo "generated code of $client is fresh"
  else
    (cd "$client" && "../../$VENV/bin/buf" generate)
  fi
done
