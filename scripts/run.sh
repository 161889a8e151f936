#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run busmq on the embedded Redis: a producer and an
# at-least-once consumer on the queue "demo". Stop with Ctrl-C. Data persists in
# ${BUSMQ_DATA_DIR:-~/.local/share/busmq/redis}. Extra arguments go to `busmq demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/busmq demo "$@"
