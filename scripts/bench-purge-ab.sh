#!/usr/bin/env bash
# What returning freed memory to the kernel at once costs the request path (docs/benchmarks/
# frontend.md, "Session 23"): `strata dev` (release) with mimalloc's defaults, then with
# MIMALLOC_PURGE_DELAY=0 MIMALLOC_PURGE_DECOMMITS=1, alternating ROUNDS times; each run puts
# 60,000 keys of 32 + 256 bytes (64 clients, 8 connections), then reads one key 200,000 times
# (serializable), and reports both rates and the frontend's resident memory.
#
#   scripts/bench-purge-ab.sh [ROUNDS]        # default 3
#
# Environment: STRATA_BIN (use this binary; default: build the release one), CARGO_TARGET_DIR.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ROUNDS="${1:-3}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
if [ -z "${STRATA_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release --locked -p strata)
  STRATA_BIN="$TARGET_DIR/release/strata"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rps() { python3 -c 'import json, sys; print(round(json.load(sys.stdin)["rps"]))'; }

one() { # $1: label; the rest: the environment of the run
  local label=$1
  shift
  local work listen metrics dev put range rss
  work="$(mktemp -d /tmp/strata-bench-purge.XXXXXX)"
  listen="127.0.0.1:$(free_port)"
  metrics="127.0.0.1:$(free_port)"
  env "$@" "$STRATA_BIN" dev --data-dir "$work/data" --listen "$listen" \
    --metrics-listen "$metrics" > "$work/dev.log" 2>&1 &
  dev=$!
  for _ in $(seq 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$metrics/readyz")" = 200 ] && break
    sleep 0.2
  done
  put=$("$STRATA_BIN" bench --endpoints "$listen" --clients 64 --conns 8 --json put \
    --total 60000 --key-space-size 60000 --key-size 32 --val-size 256 2> /dev/null | rps)
  range=$("$STRATA_BIN" bench --endpoints "$listen" --clients 64 --conns 8 --json range \
    --total 200000 --consistency s 00000000 2> /dev/null | rps)
  rss=$(curl -s "http://$metrics/metrics" |
    awk '$1 == "process_resident_memory_bytes" { printf "%d", $2 / 1048576 }')
  echo "$label put/s=$put range/s=$range resident_MiB=$rss"
  kill -TERM "$dev"
  wait "$dev" 2> /dev/null || true
  rm -rf "$work"
}

for _ in $(seq "$ROUNDS"); do
  one defaults STRATA_BENCH_RUN=1
  one purge-at-once MIMALLOC_PURGE_DELAY=0 MIMALLOC_PURGE_DECOMMITS=1
done
