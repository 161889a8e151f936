#!/usr/bin/env bash
# Build, vet and test the Go client with Debian's Go toolchain and grpc-go (GOPATH mode:
# no module proxy is needed). Extra arguments go to `go test`.
set -euo pipefail
cd "$(dirname "$0")"
export BUSMQ_GATEWAY_BIN="${BUSMQ_GATEWAY_BIN:-$(cd ../.. && pwd)/${VENV:-.venv}/bin/busmq-gateway}"
gopath=$(mktemp -d)
trap 'rm -rf "$gopath"' EXIT
mkdir -p "$gopath/src/busmq.dev"
ln -s "$PWD" "$gopath/src/busmq.dev/go"
cd "$gopath/src/busmq.dev/go"
# Go's own build cache (content-addressed, safe to share): the tests that build the Go
# client's commands (tests/support/client_programs.py) then compile nothing again.
export GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOFLAGS=
gofmt_out=$(gofmt -l ./*.go)
if [ -n "$gofmt_out" ]; then echo "gofmt: $gofmt_out" >&2; exit 1; fi
go vet ./...
# Under the suite's time limit in scripts/test.sh: a hung test panics with every goroutine's stack.
go test -count=1 -timeout 8m "$@" ./...
