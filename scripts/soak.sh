#!/usr/bin/env bash
# Soak: a write load against a local deployment (three `strata journal` nodes, one
# `strata frontend` starting from checkpoints, one `strata compactor` with periodic
# auto-compaction), sampling the journal's on-disk size, the object store's size and the
# frontend's and compactor's RSS every interval into a Markdown table (the compactor's also as
# the lowest and highest of once-a-second samples over each interval, since it swings with
# every checkpoint it encodes and uploads) (docs/benchmarks/compactor.md
# has a run). Not part of the test suite.
#
# Usage: scripts/soak.sh [duration_s=600] [interval_s=30]
# Env:   STRATA_BIN (default: target/release/strata, else target/debug/strata under
#        $CARGO_TARGET_DIR or ./target), SOAK_RETENTION (auto-compaction retention, default 1m),
#        SOAK_EVERY (checkpoint interval, default 30s), SOAK_SEGMENT (journal segment bytes,
#        default 8 MiB so that trims free whole segments within the run; the journal's default
#        is 64 MiB), SOAK_CLIENTS (default 16), SOAK_KEYS (distinct keys, default 10000),
#        SOAK_VALUE (value bytes, default 256), SOAK_KEEP=1 keeps the data directory,
#        SOAK_FRONTEND_METRICS=1 also samples the frontend's /metrics (store bytes, series).
set -euo pipefail

DURATION=${1:-600}
INTERVAL=${2:-30}
RETENTION=${SOAK_RETENTION:-1m}
EVERY=${SOAK_EVERY:-30s}
SEGMENT=${SOAK_SEGMENT:-8388608}
CLIENTS=${SOAK_CLIENTS:-16}
KEYS=${SOAK_KEYS:-10000}
VALUE=${SOAK_VALUE:-256}
BATCH=5000    # puts per `strata bench put` run; runs repeat until the duration is over

target=${CARGO_TARGET_DIR:-target}
if [[ -z "${STRATA_BIN:-}" ]]; then
  if [[ -x "$target/release/strata" ]]; then STRATA_BIN="$target/release/strata"; else STRATA_BIN="$target/debug/strata"; fi
fi
[[ -x "$STRATA_BIN" ]] || { echo "no strata binary at $STRATA_BIN (cargo build -p strata)" >&2; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
DATA=$(mktemp -d /tmp/strata-soak-XXXXXX)
J1=127.0.0.1:$(free_port); J2=127.0.0.1:$(free_port); J3=127.0.0.1:$(free_port)
JOURNALS="$J1,$J2,$J3"
ENDPOINT=127.0.0.1:$(free_port); METRICS=127.0.0.1:$(free_port); CMETRICS=127.0.0.1:$(free_port)
PIDS=()
LOAD=""
cleanup() {
  [[ -n "$LOAD" ]] && kill "$LOAD" 2>/dev/null || true
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  [[ -n "${SOAK_KEEP:-}" ]] || rm -rf "$DATA"
}
trap cleanup EXIT

i=0
for j in "$J1" "$J2" "$J3"; do
  i=$((i + 1))
  "$STRATA_BIN" journal --id "$i" --listen "$j" --peers "1=$J1,2=$J2,3=$J3" --shards 1 \
    --segment-bytes "$SEGMENT" --data-dir "$DATA/journal-$i" >"$DATA/journal-$i.log" 2>&1 &
  PIDS+=($!)
done
"$STRATA_BIN" frontend --journal "$JOURNALS" --listen "$ENDPOINT" --metrics-listen "$METRICS" \
  --object-store "file://$DATA/objects" >"$DATA/frontend.log" 2>&1 &
FRONTEND=$!; PIDS+=("$FRONTEND")
"$STRATA_BIN" compactor --journal "$JOURNALS" --object-store "file://$DATA/objects" --shards 0 \
  --every "$EVERY" --auto-compaction-mode periodic --auto-compaction-retention "$RETENTION" \
  --metrics-listen "$CMETRICS" >"$DATA/compactor.log" 2>&1 &
COMPACTOR=$!; PIDS+=("$COMPACTOR")

for _ in $(seq 1 240); do
  curl -sf "http://$METRICS/readyz" >/dev/null 2>&1 && break
  kill -0 "$FRONTEND" 2>/dev/null || { echo "frontend exited:" >&2; tail "$DATA/frontend.log" >&2; exit 1; }
  sleep 0.5
done
curl -sf "http://$METRICS/readyz" >/dev/null || { echo "frontend not ready" >&2; exit 1; }

rss_mb() { awk '/VmRSS/ {printf "%.0f", $2/1024}' "/proc/$1/status" 2>/dev/null || echo "-"; }
size_mb() { du -sb "$@" 2>/dev/null | awk '{s+=$1} END {printf "%.1f", s/1048576}'; }
metric() { curl -s "http://$CMETRICS/metrics" | awk -v m="$1" 'index($1, m) == 1 {s+=$2} END {printf "%d", s}'; }
# The frontend's own figures: its store's bytes (live + history not yet compacted) and how many
# series its /metrics exposes (a growing label set would show here).
fmetric_mb() { curl -s "http://$METRICS/metrics" | awk -v m="$1" 'index($1, m) == 1 {s+=$2} END {printf "%.1f", s/1048576}'; }
fseries() { curl -s "http://$METRICS/metrics" | grep -vc '^#'; }
revision() { ETCDCTL_API=3 etcdctl --endpoints="$ENDPOINT" endpoint status -w json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])' 2>/dev/null || echo "-"; }

(
  end=$((SECONDS + DURATION))
  seed=1
  while (( SECONDS < end )); do
    "$STRATA_BIN" bench put --endpoints "$ENDPOINT" --clients "$CLIENTS" --conns 4 --total "$BATCH" \
      --key-size 64 --val-size "$VALUE" --key-space-size "$KEYS" --seed "$seed" --json >>"$DATA/bench.jsonl" 2>>"$DATA/bench.err" || true
    seed=$((seed + 1))
  done
) &
LOAD=$!
# The compactor's RSS once a second ("seconds-since-start MB" lines), for each row's range.
( while kill -0 "$COMPACTOR" 2>/dev/null; do echo "$SECONDS $(rss_mb "$COMPACTOR")"; sleep 1; done ) >"$DATA/compactor-rss.txt" &
SAMPLER=$!
# Lowest and highest compactor RSS sampled in the seconds (from, to].
rss_range() { awk -v a="$1" -v b="$2" '$1 > a && $1 <= b && $2 != "-" { if (lo == "" || $2 < lo) lo = $2; if ($2 > hi) hi = $2 } END { if (lo == "") print "-"; else printf "%d-%d", lo, hi }' "$DATA/compactor-rss.txt"; }

echo "soak: ${DURATION}s of puts (${CLIENTS} clients, ${KEYS} keys x ${VALUE} B values), periodic auto-compaction ${RETENTION}, checkpoints every ${EVERY}, journal segments of ${SEGMENT} B; binary $STRATA_BIN; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| t (s) | revision | journal on disk (MB, 3 nodes) | objects (MB) | trimmed below | auto-compactions | frontend RSS (MB) | frontend store (MB) | frontend series | compactor RSS (MB) | compactor RSS over the interval (MB) | load avg |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
# The frontend's /metrics is read only with SOAK_FRONTEND_METRICS=1: a scrape also drains its
# histograms, so by default the frontend runs unscraped, the worst case for its memory.
fstore() { [[ -n "${SOAK_FRONTEND_METRICS:-}" ]] && fmetric_mb strata_frontend_stored_bytes || echo "-"; }
fcount() { [[ -n "${SOAK_FRONTEND_METRICS:-}" ]] && fseries || echo "-"; }
start=$SECONDS
prev=$SECONDS
while :; do
  t=$((SECONDS - start))
  echo "| $t | $(revision) | $(size_mb "$DATA"/journal-*) | $(size_mb "$DATA/objects") | $(metric strata_compactor_trimmed_below) | $(metric 'strata_compactor_auto_compactions_total{') | $(rss_mb "$FRONTEND") | $(fstore) | $(fcount) | $(rss_mb "$COMPACTOR") | $(rss_range "$prev" "$SECONDS") | $(cut -d' ' -f1 /proc/loadavg) |"
  prev=$SECONDS
  (( t >= DURATION )) && break
  sleep "$INTERVAL"
done
wait "$LOAD" 2>/dev/null || true
LOAD=""
kill "$SAMPLER" 2>/dev/null || true
puts=$(python3 -c 'import json,sys; print(sum(json.loads(l).get("ok", json.loads(l).get("requests", 0)) for l in open(sys.argv[1]) if l.strip()))' "$DATA/bench.jsonl" 2>/dev/null || echo "?")
echo
echo "bench runs: $(wc -l <"$DATA/bench.jsonl"); puts acknowledged: $puts; error lines: $(grep -c -E "ERROR|WARN" "$DATA/bench.err" || true)"
