#!/usr/bin/env bash
# How long moving an etcd cluster to Strata offline takes (docs/OPERATIONS.md, "Moving a cluster
# from etcd": `strata admin backup restore --from-etcd-snapshot`):
#   1. starts etcd 3.4 (one member, default fsync, temp dir) and puts N keys into it with
#      `strata bench put` (64-byte keys, 256-byte values, as the memstore's 1M-key figures);
#   2. takes `etcdctl snapshot save` of it and stops it;
#   3. starts `strata dev` on a temp dir and times the restore of the snapshot into its default
#      tenant (wall time, the command's CPU and peak memory);
#   4. checks the tenant then holds N keys, and how long the frontend took to have them.
#
#   scripts/bench-etcd-import.sh              # 1,000,000 keys (several minutes)
#   scripts/bench-etcd-import.sh --keys 20000 # a smoke test of the script itself
#
# Environment: STRATA_BIN (use this binary, skip the build), CARGO_TARGET_DIR.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

KEYS=1000000
while [ $# -gt 0 ]; do
  case "$1" in
    --keys) KEYS="$2"; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

command -v etcd >/dev/null && command -v etcdctl >/dev/null || {
  echo "etcd and etcdctl are needed (Debian: apt-get install etcd-server etcd-client)" >&2
  exit 1
}
if [ -z "${STRATA_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release -q -p strata)
  STRATA_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/strata"
fi

WORK="$(mktemp -d /tmp/strata-etcd-import.XXXXXX)"
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_for() { # command... : retries for up to 120 s
  local i
  for i in $(seq 1 600); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "gave up waiting for: $*" >&2
  return 1
}
# Seconds since the epoch, to the nanosecond.
seconds() { date +%s.%N; }

ETCD_PORT="$(free_port)"
ETCD_PEER="$(free_port)"
ETCD="127.0.0.1:$ETCD_PORT"
echo "== etcd $(etcd --version | head -1 | awk '{print $3}') on $ETCD; $KEYS keys"
etcd --name import --data-dir "$WORK/etcd" \
  --listen-client-urls "http://$ETCD" --advertise-client-urls "http://$ETCD" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster "import=http://127.0.0.1:$ETCD_PEER" --quota-backend-bytes 8589934592 \
  >"$WORK/etcd.log" 2>&1 &
PIDS+=($!)
wait_for env ETCDCTL_API=3 etcdctl --endpoints "$ETCD" endpoint health
t0="$(seconds)"
"$STRATA_BIN" bench --endpoints "$ETCD" --clients 256 --conns 8 put \
  --total "$KEYS" --key-space-size "$KEYS" --sequential-keys --key-size 64 --val-size 256 \
  --key-prefix /registry/ >"$WORK/load.txt"
t1="$(seconds)"
echo "loaded in $(echo "$t1 - $t0" | bc) s"
ETCDCTL_API=3 etcdctl --endpoints "$ETCD" snapshot save "$WORK/etcd.db" >/dev/null
SNAP_BYTES="$(stat -c %s "$WORK/etcd.db")"
echo "snapshot: $SNAP_BYTES bytes"
kill "${PIDS[0]}"; wait "${PIDS[0]}" 2>/dev/null || true; PIDS=()

LISTEN="127.0.0.1:$(free_port)"
"$STRATA_BIN" dev --data-dir "$WORK/dev" --listen "$LISTEN" --admin-listen "127.0.0.1:$(free_port)" \
  >"$WORK/dev.log" 2>&1 &
PIDS+=($!)
wait_for env ETCDCTL_API=3 etcdctl --endpoints "$LISTEN" endpoint health
JOURNAL="$(sed 's/^[^=]*=//' "$WORK/dev/dev-ports" | paste -sd, -)"
echo "== strata dev on $LISTEN, journal $JOURNAL"
t2="$(seconds)"
/usr/bin/time -f '%e %U %S %M' -o "$WORK/restore.time" \
  "$STRATA_BIN" admin backup restore --object-store "file://$WORK/dev/objects" --journal "$JOURNAL" \
  --from-etcd-snapshot "$WORK/etcd.db" >"$WORK/restore.txt" 2>&1 || { cat "$WORK/restore.txt" >&2; exit 1; }
read -r wall user sys rss <"$WORK/restore.time"
# The frontend applies the staged restore from the journal: count until it holds every key
# (a Range with a limit answers the count of the whole range; etcdctl 3.4 has no --count-only).
count() {
  ETCDCTL_API=3 etcdctl --endpoints "$LISTEN" get /registry/ --prefix --limit 1 -w json |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("count", 0))'
}
n=0
for i in $(seq 1 1200); do
  n="$(count || echo 0)"
  [ "$n" = "$KEYS" ] && break
  sleep 0.2
done
t3="$(seconds)"
[ "$n" = "$KEYS" ] || { echo "the tenant holds $n keys, not $KEYS" >&2; tail -20 "$WORK/dev/logs/frontend.log" >&2; exit 1; }
tail -1 "$WORK/restore.txt"
echo "restore command: ${wall} s wall, $(echo "$user + $sys" | bc) s CPU, peak RSS $((rss / 1024)) MiB"
echo "serving all $KEYS keys $(echo "$t3 - $t2" | bc) s after the restore began"
