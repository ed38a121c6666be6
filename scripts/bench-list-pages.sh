#!/usr/bin/env bash
# Writes while clients page through a large prefix, as kube-apiserver's paginated LISTs do:
#   1. loads KEYS keys of 512 bytes under list/ (default 400,000);
#   2. puts alone: PUTS puts (default 10,000) by 16 clients (256-byte values, 1,000 keys
#      under w/);
#   3. pages alone: 100 Ranges over list/ with limit 500 by 2 clients (each page also counts
#      the whole prefix, as etcd's Range does);
#   4. the puts again while 2 clients page through list/ without pause.
# against one system per run: a `strata dev` deployment (3 journal replicas, a frontend, a
# compactor) of the given binary, or etcd 3.4 (3 members on loopback, default fsync).
#
#   scripts/bench-list-pages.sh --strata target/release/strata [--out DIR] [--keys N] [--puts N]
#   scripts/bench-list-pages.sh --etcd [--out DIR] [--keys N] [--puts N]
#
# `strata bench` (from --bench-bin, default the --strata binary or target/release/strata)
# drives every workload; its JSON reports go to DIR (default
# $CARGO_TARGET_DIR/bench-list-pages/<UTC time>). Results: docs/benchmarks/frontend.md,
# "Writes during paginated LISTs".
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
SYSTEM=""
STRATA_BIN=""
BENCH_BIN=""
OUT=""
KEYS=400000
PUT_TOTAL=10000
while [ $# -gt 0 ]; do
  case "$1" in
    --strata) SYSTEM=strata; STRATA_BIN="$2"; shift ;;
    --etcd) SYSTEM=etcd ;;
    --bench-bin) BENCH_BIN="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --keys) KEYS="$2"; shift ;;
    --puts) PUT_TOTAL="$2"; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$SYSTEM" ] || { echo "give --strata BIN or --etcd" >&2; exit 2; }
BENCH_BIN="${BENCH_BIN:-${STRATA_BIN:-$TARGET_DIR/release/strata}}"
OUT="${OUT:-$TARGET_DIR/bench-list-pages/$(date -u +%Y%m%dT%H%M%SZ)-$SYSTEM}"
mkdir -p "$OUT"
WORK="$(mktemp -d /tmp/strata-bench-list-pages.XXXXXX)"
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$SYSTEM" = etcd ]; then
  EP=127.0.0.1:23791
  CLUSTER="e0=http://127.0.0.1:23801,e1=http://127.0.0.1:23802,e2=http://127.0.0.1:23803"
  for n in 0 1 2; do
    etcd --name "e$n" --data-dir "$WORK/e$n" \
      --listen-client-urls "http://127.0.0.1:2379$((n + 1))" --advertise-client-urls "http://127.0.0.1:2379$((n + 1))" \
      --listen-peer-urls "http://127.0.0.1:2380$((n + 1))" --initial-advertise-peer-urls "http://127.0.0.1:2380$((n + 1))" \
      --initial-cluster "$CLUSTER" --initial-cluster-state new --initial-cluster-token list-pages \
      --quota-backend-bytes 8589934592 >"$OUT/etcd$n.log" 2>&1 &
    PIDS+=($!)
  done
else
  EP=127.0.0.1:23790
  "$STRATA_BIN" dev --data-dir "$WORK/dev" --listen "$EP" >"$OUT/dev.log" 2>&1 &
  PIDS+=($!)
fi
bench() { "$BENCH_BIN" bench --endpoints="$EP" "$@"; }
for _ in $(seq 1 120); do
  bench put --total 1 --key-prefix ready/ >/dev/null 2>&1 && break
  sleep 1
done
echo "loading $KEYS keys under list/" >&2
bench --conns 8 --clients 64 put --total "$KEYS" --key-space-size "$KEYS" --sequential-keys \
  --key-prefix list/ --key-size 24 --val-size 512 >"$OUT/load.txt" 2>&1
PUTS=(--json --conns 4 --clients 16 put --total "$PUT_TOTAL" --key-prefix w/ --key-size 16 --val-size 256 --key-space-size 1000)
PAGES=(--json --conns 2 --clients 2 range list/ --prefix --limit 500 --consistency s)
echo "puts alone" >&2
bench "${PUTS[@]}" >"$OUT/put-alone.json" 2>"$OUT/put-alone.err"
echo "pages alone" >&2
bench "${PAGES[@]}" --total 100 >"$OUT/pages-alone.json" 2>"$OUT/pages-alone.err"
echo "puts while 2 clients page" >&2
bench "${PAGES[@]}" --total 100000000 >/dev/null 2>"$OUT/pages-during.err" &
PAGER=$!
sleep 2
bench "${PUTS[@]}" >"$OUT/put-during.json" 2>"$OUT/put-during.err"
kill "$PAGER" 2>/dev/null || true
wait "$PAGER" 2>/dev/null || true
python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
for name in ["put-alone", "pages-alone", "put-during"]:
    d = json.load(open(f"{out}/{name}.json"))
    l = d["latency_ms"]
    print(f"{name:12} {d['rps']:9.0f}/s  p50 {l['p50']:8.2f} ms  p99 {l['p99']:8.2f} ms  max {l['max']:8.1f} ms  errors {d['errors']}")
EOF
echo "reports: $OUT" >&2
