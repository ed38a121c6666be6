#!/usr/bin/env bash
# What serving many tenants on one frontend costs a busy one: put and linearizable range against
# the default tenant of a frontend that serves it alone, and of one that also serves N idle
# tenants (each its own replica tailing the shard: docs/design/tenants.md, "Built"), in
# alternating rounds. Each frontend is a `strata dev` deployment of its own on loopback (no
# compactor). The numbers of docs/benchmarks/frontend.md, "Session 20: many tenants".
#
#   scripts/bench-tenants.sh [N] [ROUNDS]
#
# Needs etcdctl and a release `strata` (STRATA_BIN, default $CARGO_TARGET_DIR/release/strata).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STRATA_BIN="${STRATA_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/strata}"
N="${1:-20}"
ROUNDS="${2:-3}"
WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ONE="127.0.0.1:$(free_port)"
MANY="127.0.0.1:$(free_port)"
TENANTS="$(seq -f 't%02g' 1 "$N" | paste -sd, -)"

"$STRATA_BIN" dev --data-dir "$WORK/one" --listen "$ONE" --no-compactor >"$WORK/one.log" 2>&1 &
PIDS+=($!)
"$STRATA_BIN" dev --data-dir "$WORK/many" --listen "$MANY" --no-compactor \
  --frontend-arg="--tenants=$TENANTS" --frontend-arg=--trust-tenant-header >"$WORK/many.log" 2>&1 &
PIDS+=($!)
for ep in "$ONE" "$MANY"; do
  for _ in $(seq 1 300); do
    ETCDCTL_API=3 etcdctl --endpoints "$ep" endpoint health >/dev/null 2>&1 && break
    sleep 0.2
  done
done

run() {
  local ep=$1 label=$2
  shift 2
  "$STRATA_BIN" bench --endpoints "$ep" --conns 32 --clients 256 --json "$@" 2>/dev/null |
    python3 -c "import json,sys; d=json.load(sys.stdin); print('$label', round(d['rps']), 'p99_ms', round(d['latency_ms']['p99'], 1), 'errors', d['errors'])"
}

echo "load: $(cut -d' ' -f1-3 /proc/loadavg); frontend of $ONE serves 1 tenant, of $MANY $((N + 1))"
for round in $(seq 1 "$ROUNDS"); do
  for pair in "one:$ONE" "many:$MANY"; do
    label=${pair%%:*}
    ep=${pair#*:}
    run "$ep" "round $round $label put" put --total 30000 --val-size 256 --key-size 16 \
      --key-space-size 100000 --key-prefix bench/
    run "$ep" "round $round $label range" range --total 60000 bench/00000000000001
  done
done
