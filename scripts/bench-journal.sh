#!/usr/bin/env bash
# Journal figures in one run on this machine:
#   1. fsync probe: sequential 4 KiB write + fdatasync per second and its latency;
#   2. `strata journal bench`: 256-byte appends at 1, 16, 256 concurrent appenders on a 3-node
#      journal on loopback;
#   3. etcd 3.4 (3 members on loopback, default fsync): `strata bench put` with 256-byte values
#      at the same concurrencies, against the leader.
# Usage: scripts/bench-journal.sh [--quick | --handoff]
#   --handoff: instead, the write pause of leader hand-offs: 16 appenders on shard 0 of a
#   3-node, 3-shard journal while `strata journal handoff` moves shard 0's leader back and
#   forth 6 times, 4 s apart (each answer says how long the leader paused writes; the bench's "max ms"
#   is the worst pause an appender saw).
# Needs: etcd (Debian's etcd-server) on PATH. Builds `strata` in release mode, unless
# STRATA_BIN names a binary to measure instead (e.g. an older build, for a before/after).
# JOURNAL_BENCH_ARGS adds flags to `strata journal bench` (e.g. `--append-rpc unary`).
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0
HANDOFF=0
[ "${1:-}" = "--quick" ] && QUICK=1
[ "${1:-}" = "--handoff" ] && HANDOFF=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/strata-target}"
if [ -n "${STRATA_BIN:-}" ]; then
  BIN="$STRATA_BIN"
else
  cargo build --release -p strata >&2
  BIN="$CARGO_TARGET_DIR/release/strata"
fi
DUR=10s; ETCD_TOTAL=(3000 30000 100000)
[ "$QUICK" = 1 ] && { DUR=2s; ETCD_TOTAL=(300 3000 10000); }
WORK="$(mktemp -d /tmp/strata-bench-journal.XXXXXX)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

echo "== machine: $(nproc) cores, $(uname -r), $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$HANDOFF" = 1 ]; then
  P=($(free_port) $(free_port) $(free_port))
  PEERS="1=127.0.0.1:${P[0]},2=127.0.0.1:${P[1]},3=127.0.0.1:${P[2]}"
  EPS="127.0.0.1:${P[0]},127.0.0.1:${P[1]},127.0.0.1:${P[2]}"
  for i in 0 1 2; do
    STRATA_LOG=info "$BIN" journal --id $((i + 1)) --listen "127.0.0.1:${P[$i]}" --peers "$PEERS" \
      --data-dir "$WORK/journal-$((i + 1))" --shards 3 --handoff-settle 0s \
      >"$WORK/journal-$((i + 1)).log" 2>&1 &
    PIDS+=($!)
  done
  sleep 4
  "$BIN" journal bench --endpoints "$EPS" --shard 0 --clients 16 --duration 36s --entry-bytes 256 &
  BENCH=$!
  sleep 6
  for to in 2 1 3 1 2 1; do
    "$BIN" journal handoff --endpoints "$EPS" --shards 3 --shard 0 --start --to "$to" || true
    # A leader of less than 2.3 s first waits (writes not paused) until its own vote is free.
    sleep 4
  done
  wait "$BENCH"
  echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  exit 0
fi
echo "== fsync probe ($WORK)"
"$BIN" journal fsync-probe --dir "$WORK" --duration 5s

echo "== strata journal: 3 nodes on loopback"
P=($(free_port) $(free_port) $(free_port))
PEERS="1=127.0.0.1:${P[0]},2=127.0.0.1:${P[1]},3=127.0.0.1:${P[2]}"
for i in 0 1 2; do
  STRATA_LOG=warn "$BIN" journal --id $((i + 1)) --listen "127.0.0.1:${P[$i]}" --peers "$PEERS" \
    --data-dir "$WORK/journal-$((i + 1))" --shards 1 >"$WORK/journal-$((i + 1)).log" 2>&1 &
  PIDS+=($!)
done
# "client us" / "nodes us": CPU time per append of the bench client and of the 3 nodes together.
"$BIN" journal bench --endpoints "127.0.0.1:${P[0]},127.0.0.1:${P[1]},127.0.0.1:${P[2]}" \
  --clients 1,16,256 --duration "$DUR" --entry-bytes 256 \
  --node-pids "$(IFS=,; echo "${PIDS[*]}")" ${JOURNAL_BENCH_ARGS:-}
for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
PIDS=()

echo "== etcd $(etcd --version | head -1 | awk '{print $3}'): 3 members on loopback, default fsync"
E=($(free_port) $(free_port) $(free_port) $(free_port) $(free_port) $(free_port))
CLUSTER="e1=http://127.0.0.1:${E[3]},e2=http://127.0.0.1:${E[4]},e3=http://127.0.0.1:${E[5]}"
for i in 0 1 2; do
  etcd --name "e$((i + 1))" --data-dir "$WORK/etcd-$((i + 1))" \
    --listen-client-urls "http://127.0.0.1:${E[$i]}" --advertise-client-urls "http://127.0.0.1:${E[$i]}" \
    --listen-peer-urls "http://127.0.0.1:${E[$((i + 3))]}" --initial-advertise-peer-urls "http://127.0.0.1:${E[$((i + 3))]}" \
    --initial-cluster "$CLUSTER" --initial-cluster-state new --initial-cluster-token strata-bench-journal \
    >"$WORK/etcd-$((i + 1)).log" 2>&1 &
  PIDS+=($!)
done
ALL="127.0.0.1:${E[0]},127.0.0.1:${E[1]},127.0.0.1:${E[2]}"
for _ in $(seq 1 100); do
  ETCDCTL_API=3 etcdctl --endpoints="$ALL" endpoint health >/dev/null 2>&1 && break
  sleep 0.2
done
LEADER="$(ETCDCTL_API=3 etcdctl --endpoints="$ALL" endpoint status -w json | python3 -c '
import json, sys
for s in json.load(sys.stdin):
    if s["Status"]["header"]["member_id"] == s["Status"]["leader"]:
        print(s["Endpoint"].replace("http://", "")); break')"
echo "etcd leader: $LEADER"
i=0
for c in 1 16 256; do
  conns=$(( c < 32 ? c : 32 ))
  echo "-- etcd put, $c clients, $conns conns, 256 B values"
  "$BIN" bench --endpoints "$LEADER" --conns "$conns" --clients "$c" put --total "${ETCD_TOTAL[$i]}" \
    --key-size 8 --val-size 256 --key-space-size 100000
  i=$((i + 1))
done
