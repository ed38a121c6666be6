#!/usr/bin/env bash
# What idle tenants cost a frontend, and what waking one costs (docs/benchmarks/frontend.md,
# "Idle tenants"), on this machine, through `strata dev`:
#   1. starts `strata dev` with --tenant-idle-unload=IDLE and a compactor checkpointing often;
#   2. creates N tenants and puts K keys of V-byte values in each (`strata bench put --tenant`);
#   3. once the compactor checkpointed them, records the frontend's resident memory with every
#      tenant loaded (after a request to each, so none is idle yet);
#   4. waits until every tenant is unloaded and records it again;
#   5. times the first request to each tenant (a JSON gateway range with curl): a load from its
#      newest checkpoint plus the journal after it, while the request waits;
#   6. prints a table and writes it, with the raw numbers, to the results directory.
# With --memory-budget SIZE the frontend runs with that budget and no idle unload instead: step
# 4 waits until the loaded tenants' bytes are within the budget (the least recently used
# unloaded) and step 5 sweeps every tenant in turn, each dormant one loaded for its request
# while others are unloaded behind it.
#
#   scripts/bench-idle-tenants.sh [--tenants N] [--keys K] [--value-bytes V] [--idle 5s]
#                                 [--memory-budget 8MiB] [--out DIR]
#
# Environment: STRATA_BIN (use this binary; default: build the release one), CARGO_TARGET_DIR.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

TENANTS=20
KEYS=20000
VALUE_BYTES=256
IDLE=5s
BUDGET=""
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tenants) TENANTS="$2"; shift ;;
    --keys) KEYS="$2"; shift ;;
    --value-bytes) VALUE_BYTES="$2"; shift ;;
    --idle) IDLE="$2"; shift ;;
    --memory-budget) BUDGET="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
if [ -z "${STRATA_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release --locked -p strata)
  STRATA_BIN="$TARGET_DIR/release/strata"
fi
OUT="${OUT:-$TARGET_DIR/bench-idle-tenants/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
WORK="$(mktemp -d /tmp/strata-bench-idle.XXXXXX)"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
LISTEN="127.0.0.1:$(free_port)"
METRICS="127.0.0.1:$(free_port)"
ADMIN="127.0.0.1:$(free_port)"

UNLOAD=("--frontend-arg=--tenant-idle-unload=$IDLE")
if [ -n "$BUDGET" ]; then
  UNLOAD=("--frontend-arg=--tenant-idle-unload=0s" "--frontend-arg=--memory-budget=$BUDGET")
fi
"$STRATA_BIN" dev --data-dir "$WORK/data" --listen "$LISTEN" --metrics-listen "$METRICS" \
  --admin-listen "$ADMIN" "${UNLOAD[@]}" \
  --compactor-arg=--every=2s --compactor-arg=--every-entries=1000 \
  > "$OUT/dev.log" 2>&1 &
DEV=$!
cleanup() { kill -TERM "$DEV" 2>/dev/null; wait "$DEV" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

metric() { curl -s "http://$METRICS/metrics" | awk -v m="$1" '$1 == m { print $2 }'; }
for _ in $(seq 600); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$METRICS/readyz")" = 200 ] && break
  sleep 0.2
done

echo "creating $TENANTS tenants, $KEYS keys of $VALUE_BYTES bytes each"
for i in $(seq "$TENANTS"); do
  "$STRATA_BIN" admin tenant create "t$i" --endpoint "http://$ADMIN" > /dev/null
  "$STRATA_BIN" bench --endpoints "$LISTEN" --tenant "t$i" --clients 16 --conns 2 --json put \
    --total "$KEYS" --key-space-size "$KEYS" --sequential-keys --key-size 32 \
    --val-size "$VALUE_BYTES" > "$OUT/put-t$i.json"
done

range() { # the first key of tenant $1 through the JSON gateway; prints curl's total seconds
  curl -s -o /dev/null -w '%{time_total}' -X POST "http://$LISTEN/v3/kv/range" \
    -H "x-strata-tenant: $1" -d '{"key": "MDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDA="}'
}
# The compactor checkpoints each tenant (a wake then loads a checkpoint, not the whole journal).
sleep 6
for i in $(seq "$TENANTS"); do range "t$i" > /dev/null; done
loaded_rss=$(metric process_resident_memory_bytes)
loaded_n=$(metric strata_frontend_tenants_loaded)

if [ -n "$BUDGET" ]; then
  echo "waiting for the loaded tenants to fit the budget ($BUDGET)"
  budget_bytes=$(metric strata_frontend_memory_budget_bytes)
  for _ in $(seq 600); do
    awk -v l="$(metric strata_frontend_tenants_loaded_bytes)" -v b="$budget_bytes" \
      'BEGIN { exit !(l + 0 <= b + 0) }' && break
    sleep 0.5
  done
else
  echo "waiting for the tenants to be unloaded (idle $IDLE)"
  for _ in $(seq 600); do
    [ "$(metric strata_frontend_tenants_loaded)" = 0 ] && break
    sleep 0.5
  done
fi
sleep 2
idle_rss=$(metric process_resident_memory_bytes)
idle_n=$(metric strata_frontend_tenants_loaded)
idle_bytes=$(metric strata_frontend_tenants_loaded_bytes)

: > "$OUT/wake-seconds.txt"
for i in $(seq "$TENANTS"); do range "t$i" >> "$OUT/wake-seconds.txt"; echo >> "$OUT/wake-seconds.txt"; done
again_ms=$(for i in $(seq "$TENANTS"); do range "t$i"; echo; done | sort -n | awk '{a[NR]=$1} END {printf "%.2f", a[int((NR+1)/2)]*1000}')
sleep 1
woken_rss=$(metric process_resident_memory_bytes)
woken_n=$(metric strata_frontend_tenants_loaded)
wake_ms=$(sort -n "$OUT/wake-seconds.txt" | awk '{a[NR]=$1} END {printf "%.1f %.1f", a[int((NR+1)/2)]*1000, a[NR]*1000}')

{
  if [ -n "$BUDGET" ]; then
    echo "tenants=$TENANTS keys_per_tenant=$KEYS value_bytes=$VALUE_BYTES memory_budget=$BUDGET"
    echo "frontend resident, after a request to each ($loaded_n loaded): $((loaded_rss / 1048576)) MiB"
    echo "frontend resident, within the budget ($idle_n loaded, $((${idle_bytes%.*} / 1048576)) MiB of tenants): $((idle_rss / 1048576)) MiB"
    echo "frontend resident, after a sweep of every tenant ($woken_n loaded): $((woken_rss / 1048576)) MiB"
  else
    echo "tenants=$TENANTS keys_per_tenant=$KEYS value_bytes=$VALUE_BYTES idle=$IDLE"
    echo "frontend resident, all $loaded_n loaded: $((loaded_rss / 1048576)) MiB"
    echo "frontend resident, all unloaded:         $((idle_rss / 1048576)) MiB"
    echo "frontend resident, all loaded again:     $((woken_rss / 1048576)) MiB"
  fi
  echo "first request after unload (wake), median / max ms: $wake_ms"
  echo "next request, median ms:                            $again_ms"
} | tee "$OUT/summary.txt"
echo "results in $OUT"
