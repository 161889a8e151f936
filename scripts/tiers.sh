# Timing of CI tiers: `tier NAME command...` runs the command and records its wall time;
# `tier_times` prints every tier recorded so far (sourced by scripts/test.sh and .ci/run).
if [ -z "${TIERS_FILE:-}" ]; then
  TIERS_FILE="$(mktemp -t busmq-tiers.XXXXXX)"
  trap 'rm -f "$TIERS_FILE"' EXIT
fi
export TIERS_FILE

tier() {
  local name="$1" started=$SECONDS
  shift
  "$@"
  printf '%-28s %5ds\n' "$name" $((SECONDS - started)) >>"$TIERS_FILE"
}

tier_times() {
  echo "==> time per tier"
  cat "$TIERS_FILE"
}
