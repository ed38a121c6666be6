#!/usr/bin/env bash
# Put and linearizable range with auth off, then enabled (as root, then as a user whose one role
# may read and write the prefix `bench/`), against each endpoint given, in rounds. The numbers of
# docs/benchmarks/frontend.md, "Session 18: with auth enabled".
#
#   scripts/bench-auth.sh ETCD_ENDPOINT STRATA_ENDPOINT [ROUNDS]
#
# Both endpoints must serve a fresh store with auth disabled (e.g. `etcd --data-dir ...` and
# `strata dev --data-dir ...` on loopback). Needs etcdctl and a release `strata` (STRATA_BIN,
# default $CARGO_TARGET_DIR/release/strata). Leaves auth disabled and the users in place.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STRATA_BIN="${STRATA_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/strata}"
[ $# -ge 2 ] || { sed -n '2,10p' "$0"; exit 2; }
ENDPOINTS=("$1" "$2")
ROUNDS="${3:-3}"

ctl() { ETCDCTL_API=3 etcdctl --endpoints "$1" "${@:2}"; }

setup() {
  local ep=$1
  ctl "$ep" user add root:rootpw >/dev/null
  ctl "$ep" role add root >/dev/null 2>&1 || true
  ctl "$ep" user grant-role root root >/dev/null
  ctl "$ep" user add app:apppw >/dev/null
  ctl "$ep" role add app >/dev/null
  ctl "$ep" role grant-permission app --prefix=true readwrite bench/ >/dev/null
  ctl "$ep" user grant-role app app >/dev/null
}

run() {
  local ep=$1 label=$2 user=$3
  shift 3
  # shellcheck disable=SC2086 # $user is empty or two words on purpose
  "$STRATA_BIN" bench --endpoints "$ep" --conns 32 --clients 256 --json $user "$@" 2>/dev/null |
    python3 -c "import json,sys; d=json.load(sys.stdin); print('$label', round(d['rps']), 'p99_ms', round(d['latency_ms']['p99'], 1), 'errors', d['errors'])"
}

for ep in "${ENDPOINTS[@]}"; do setup "$ep"; done
for round in $(seq 1 "$ROUNDS"); do
  for ep in "${ENDPOINTS[@]}"; do
    ctl "$ep" --user root:rootpw auth disable >/dev/null 2>&1 || true
  done
  for mode in off root app; do
    for ep in "${ENDPOINTS[@]}"; do
      case $mode in
        off) user="" ;;
        root) user="--user root:rootpw"; ctl "$ep" auth enable >/dev/null 2>&1 || true ;;
        app) user="--user app:apppw" ;;
      esac
      run "$ep" "round $round $ep $mode put" "$user" put --total 30000 --val-size 256 \
        --key-size 16 --key-space-size 100000 --key-prefix bench/
      run "$ep" "round $round $ep $mode range" "$user" range --total 60000 bench/00000000000001
    done
  done
done
for ep in "${ENDPOINTS[@]}"; do
  ctl "$ep" --user root:rootpw auth disable >/dev/null 2>&1 || true
done
