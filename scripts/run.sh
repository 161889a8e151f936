#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the busmq gateway on the embedded Redis, on
# 127.0.0.1:8443. The shared secret comes from BUSMQ_GATEWAY_SECRETS; if none is set,
# one is generated into .busmq-secret and printed. Stop with Ctrl-C (drains cleanly).
# Extra arguments go to busmq-gateway (see .venv/bin/busmq-gateway --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -z "${BUSMQ_GATEWAY_SECRETS:-}" ]; then
  if [ ! -s .busmq-secret ]; then
    (umask 077; .venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(32))' > .busmq-secret)
  fi
  echo "==> secret in .busmq-secret: call with -H \"authorization: Bearer \$(cat .busmq-secret)\""
  set -- --secret-file .busmq-secret "$@"
fi
exec .venv/bin/busmq-gateway --log-format text "$@"
