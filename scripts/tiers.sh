# Timing of CI tiers: `tier NAME command...` runs the command and records its wall time;
# `tier_times` prints every tier recorded so far; a tier that fails is timed too, and
# `tier` returns its status (sourced by scripts/test.sh and .ci/run).
if [ -z "${TIERS_FILE:-}" ]; then
  TIERS_FILE="$(mktemp -t busmq-tiers.XXXXXX)"
  trap 'rm -f "$TIERS_FILE"' EXIT
fi
export TIERS_FILE

tier() {
  local name="$1" started=$SECONDS status=0
  shift
  "$@" || status=$?
  printf '%-28s %5ds\n' "$name" $((SECONDS - started)) >>"$TIERS_FILE"
  return "$status"
}

tier_times() {
  echo "==> time per tier"
  cat "$TIERS_FILE"
}

# `tier_start NAME command...`: a tier run in the background, its output held back;
# `tiers_wait` waits for the tiers started so far, prints each one's output in the order
# they were started, and fails if any failed. For tiers that mostly wait (on servers, on
# the network, on the disk), which overlap well on a machine of two cores.
TIER_PIDS=()
TIER_NAMES=()
TIER_LOGS=()

tier_start() {
  local log
  log="$(mktemp -t busmq-tier-log.XXXXXX)"
  (tier "$@") >"$log" 2>&1 &
  TIER_PIDS+=("$!")
  TIER_NAMES+=("$1")
  TIER_LOGS+=("$log")
}

tiers_wait() {
  local i failed=0
  for i in "${!TIER_PIDS[@]}"; do
    if wait "${TIER_PIDS[$i]}"; then
      echo "==> ${TIER_NAMES[$i]}: done"
    else
      echo "==> ${TIER_NAMES[$i]}: FAILED"
      failed=1
    fi
    cat "${TIER_LOGS[$i]}"
    rm -f "${TIER_LOGS[$i]}"
  done
  TIER_PIDS=()
  TIER_NAMES=()
  TIER_LOGS=()
  return "$failed"
}
