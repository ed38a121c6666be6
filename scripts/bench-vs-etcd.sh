#!/usr/bin/env bash
# Strata against etcd 3.4 on this machine, in one run, with the same `strata bench` workloads:
#   1. builds `strata` (release), installs etcd 3.4 + etcdctl from Debian if absent;
#   2. starts etcd as 3 members on loopback (default fsync, temp dir), runs the workloads, stops it;
#   3. starts Strata (3 `strata journal` nodes + one `strata frontend`), runs the workloads, adds a
#      second frontend and runs the read and watch workloads over both;
#   4. prints a table of both and the ratios against the issue's targets, and writes it (plus
#      every raw JSON report and the machine state) to a results directory.
#
#   scripts/bench-vs-etcd.sh                 # full run (a few minutes)
#   scripts/bench-vs-etcd.sh --quick         # small totals: a smoke test of the script itself
#   scripts/bench-vs-etcd.sh --etcd-only     # only the etcd half
#   scripts/bench-vs-etcd.sh --tls           # both client ports over TLS with client certificates
#                                            # (--client-cert-auth), as a managed deployment serves them
#   scripts/bench-vs-etcd.sh --internal-tls  # --tls, and each system's own traffic over mutual TLS too:
#                                            # etcd's peers (--peer-*), Strata's journal (--internal-*)
#   scripts/bench-vs-etcd.sh --out DIR       # results directory (default: $CARGO_TARGET_DIR/bench-vs-etcd/<UTC time>)
#
# Environment: STRATA_BIN (use this binary, skip the build), CARGO_TARGET_DIR, STRATA_SKIP_INSTALL=1,
# STRATA_FE_WORKERS (tokio workers of the one-frontend phase, default 1).
# Each workload's flags are in the WORKLOADS section below; docs/BENCHMARKS.md explains the ratios.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

QUICK=0
ETCD_ONLY=0
TLS=0
INTERNAL_TLS=0
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --etcd-only) ETCD_ONLY=1 ;;
    --out) OUT="$2"; shift ;;
    --tls) TLS=1 ;;
    --internal-tls) TLS=1; INTERNAL_TLS=1 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
OUT="${OUT:-$TARGET_DIR/bench-vs-etcd/$STAMP}"
mkdir -p "$OUT/json" "$OUT/logs"
WORK="$(mktemp -d /tmp/strata-bench-vs-etcd.XXXXXX)"
PIDS=()
FRONTEND_PIDS=()

log() { printf '\n=== %s\n' "$*" | tee -a "$OUT/run.log" >&2; }

# Stops only what this script started, by pid, then removes the data directories.
cleanup() {
  stop_all
  rm -rf "$WORK"
}
stop_all() {
  local p
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null
  done
  for p in "${PIDS[@]:-}"; do
    [ -n "$p" ] && wait "$p" 2>/dev/null
  done
  PIDS=()
  FRONTEND_PIDS=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- sizes
if [ "$QUICK" = 1 ]; then
  PUT_TOTAL=2000; RANGE_TOTAL=2000; CAS_TOTAL=1000; CYCLE_TOTAL=200
  WATCHERS=100; WATCH_STREAMS=10; WATCH_PUTS=20; WATCH_RATE=20; WL_TOTAL=20
else
  PUT_TOTAL=30000; RANGE_TOTAL=60000; CAS_TOTAL=10000; CYCLE_TOTAL=3000
  WATCHERS=1000; WATCH_STREAMS=100; WATCH_PUTS=200; WATCH_RATE=100; WL_TOTAL=200
fi
READY_TIMEOUT=120

# ---------------------------------------------------------------- build and install
if [ -z "${STRATA_BIN:-}" ]; then
  log "building strata (release)"
  (cd "$ROOT" && cargo build --release -p strata) >>"$OUT/run.log" 2>&1 || { echo "build failed: see $OUT/run.log" >&2; exit 1; }
  STRATA_BIN="$TARGET_DIR/release/strata"
fi
if [ "${STRATA_SKIP_INSTALL:-0}" != 1 ] && ! { command -v etcd && command -v etcdctl; } >/dev/null 2>&1; then
  log "installing etcd-server and etcd-client (Debian)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  # RUNLEVEL=1 keeps the package from starting a system etcd on :2379.
  $SUDO env RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server etcd-client
fi
command -v etcd >/dev/null || { echo "etcd not found" >&2; exit 1; }

free_ports() { # N -> N free loopback ports
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# --tls: one CA (made by `strata dev cert`, with the server certificate for 127.0.0.1), the same
# server flags for etcd and Strata, and a client certificate for the load generator and etcdctl.
SCHEME=http; SERVER_TLS=(); CLIENT_TLS=(); ETCDCTL_TLS=()
if [ "$TLS" = 1 ]; then
  "$STRATA_BIN" dev cert bench --data-dir "$WORK/pki" --common-name root >>"$OUT/run.log" 2>&1 \
    || { echo "cannot make certificates: see $OUT/run.log" >&2; exit 1; }
  PKI="$WORK/pki/tls"; SCHEME=https
  SERVER_TLS=(--cert-file "$PKI/server.pem" --key-file "$PKI/server.key" --trusted-ca-file "$PKI/ca.pem" --client-cert-auth)
  CLIENT_TLS=(--cacert "$PKI/ca.pem" --cert "$PKI/bench.pem" --key "$PKI/bench.key")
  ETCDCTL_TLS=(--cacert="$PKI/ca.pem" --cert="$PKI/bench.pem" --key="$PKI/bench.key")
  echo "TLS: client ports over TLS, client certificates required" >>"$OUT/run.log"
fi
# --internal-tls: etcd's peer traffic and Strata's journal traffic over mutual TLS, with the
# internal CA `strata dev cert` also makes (a certificate for 127.0.0.1, server and client).
PEER_SCHEME=http; ETCD_PEER_TLS=(); STRATA_INTERNAL_TLS=()
if [ "$INTERNAL_TLS" = 1 ]; then
  IPKI="$WORK/pki/tls/internal"; PEER_SCHEME=https
  ETCD_PEER_TLS=(--peer-cert-file "$IPKI/server.pem" --peer-key-file "$IPKI/server.key" --peer-trusted-ca-file "$IPKI/ca.pem" --peer-client-cert-auth)
  STRATA_INTERNAL_TLS=(--internal-trusted-ca-file "$IPKI/ca.pem" --internal-cert-file "$IPKI/server.pem" --internal-key-file "$IPKI/server.key")
  echo "internal TLS: etcd peers and Strata's journal over mutual TLS" >>"$OUT/run.log"
fi

bench() { STRATA_LOG=warn "$STRATA_BIN" bench ${CLIENT_TLS[@]+"${CLIENT_TLS[@]}"} "$@"; }

# Waits until a put through ENDPOINTS succeeds.
wait_serving() { # endpoints
  local deadline=$((SECONDS + READY_TIMEOUT))
  until bench --endpoints="$1" put --total 1 --key-prefix ready/ --key-size 14 >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.5
  done
}

machine_state() { # label
  {
    echo "## $1 ($(date -u +%H:%M:%SZ))"
    echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); cores: $(nproc)"
    echo "other compilers running: $(pgrep -c -x rustc 2>/dev/null || true) rustc, $(pgrep -c -x cargo 2>/dev/null || true) cargo"
  } >>"$OUT/machine.md"
}

# CPU ticks (user + system) used so far by the server processes this script started (or by the
# pids given).
CLK_TCK="$(getconf CLK_TCK)"
server_cpu() {
  local p total=0
  [ $# -gt 0 ] || set -- "${PIDS[@]:-}"
  for p in "$@"; do
    # An empty pid would read /proc//stat, the whole machine's counters.
    [ -n "$p" ] && [ -r "/proc/$p/stat" ] || continue
    total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$total"
}

# Runs one workload: name, endpoints, then strata bench flags. Saves json/<system>-<name>.json
# and json/<system>-<name>.cpu (server ticks, ticks per second, load-generator CPU seconds and
# the frontends' share of the server ticks during the workload: far less sensitive to a busy
# machine than throughput).
SYSTEM=""
run() {
  local name="$1" eps="$2"; shift 2
  local file="$OUT/json/$SYSTEM-$name.json" t0 t1 f0 f1 bench_cpu
  log "$SYSTEM: $name: strata bench --endpoints=$eps $*"
  machine_state "$SYSTEM $name (before)"
  t0="$(server_cpu)"
  f0="$(server_cpu "${FRONTEND_PIDS[@]:-}")"
  local TIMEFORMAT='%U %S'
  if ! { time bench --endpoints="$eps" --json "$@" >"$file" 2>>"$OUT/logs/bench-$SYSTEM-$name.err"; } 2>"$OUT/json/.time"; then
    echo "  failed: see $OUT/logs/bench-$SYSTEM-$name.err" | tee -a "$OUT/run.log" >&2
    [ -s "$file" ] || echo '{"failed": true}' >"$file"
  fi
  t1="$(server_cpu)"
  f1="$(server_cpu "${FRONTEND_PIDS[@]:-}")"
  bench_cpu="$(awk '{print $1 + $2}' "$OUT/json/.time")"
  echo "$(( t1 - t0 )) $CLK_TCK $bench_cpu $(( f1 - f0 ))" >"$OUT/json/$SYSTEM-$name.cpu"
}

# ---------------------------------------------------------------- WORKLOADS
# The same flags against both systems. Writes go to one endpoint list, reads and watches to another.
RANGE_KEY="bench-range/00000000"
suite_writes() { # endpoints
  run put-256 "$1" --conns 32 --clients 256 put --total "$PUT_TOTAL" --key-size 8 --val-size 256 --key-space-size 100000
  run txn-cas-64 "$1" --conns 16 --clients 64 txn-cas --total "$CAS_TOTAL" --key-size 8 --val-size 256 --key-space-size 1000 --key-prefix cas/
  # etcd's lock and election services (etcdctl lock / elect): 64 clients each on a name of its
  # own, then 16 clients queued on one name (each hand-off a delete its successor must watch).
  run lock-64 "$1" --conns 16 --clients 64 lock --total "$CYCLE_TOTAL" --names 64
  run lock-1name-16 "$1" --conns 4 --clients 16 lock --total "$((CYCLE_TOTAL / 3))" --names 1
  run election-1name-16 "$1" --conns 4 --clients 16 election --total "$((CYCLE_TOTAL / 3))" --names 1
}
suite_reads() { # label-suffix endpoints
  bench --endpoints="$2" put --total 1 --key-prefix bench-range/ --key-size 20 --val-size 256 >/dev/null 2>&1
  run "range-l-64$1" "$2" --conns 16 --clients 64 range "$RANGE_KEY" --consistency l --total "$RANGE_TOTAL"
  run "range-s-64$1" "$2" --conns 16 --clients 64 range "$RANGE_KEY" --consistency s --total "$RANGE_TOTAL"
}
suite_watch() { # label-suffix endpoints (the writer uses the first connection, i.e. the first endpoint)
  run "watch-$WATCHERS$1" "$2" --conns 4 watch --watchers "$WATCHERS" --streams "$WATCH_STREAMS" --put-total "$WATCH_PUTS" --put-rate "$WATCH_RATE" --val-size 256
  run "watch-latency-10$1" "$2" --conns 10 watch-latency --watchers 10 --total "$WL_TOTAL" --put-rate 50 --val-size 256
}

# ---------------------------------------------------------------- etcd
log "etcd $(etcd --version | head -1 | awk '{print $3}'): 3 members on loopback, default fsync"
SYSTEM=etcd
read -r -a EP <<<"$(free_ports 6)"
CLUSTER="e1=$PEER_SCHEME://127.0.0.1:${EP[3]},e2=$PEER_SCHEME://127.0.0.1:${EP[4]},e3=$PEER_SCHEME://127.0.0.1:${EP[5]}"
for i in 0 1 2; do
  n=$((i + 1))
  etcd --name "e$n" --data-dir "$WORK/etcd-$n" \
    --listen-client-urls "$SCHEME://127.0.0.1:${EP[$i]}" --advertise-client-urls "$SCHEME://127.0.0.1:${EP[$i]}" \
    ${SERVER_TLS[@]+"${SERVER_TLS[@]}"} ${ETCD_PEER_TLS[@]+"${ETCD_PEER_TLS[@]}"} \
    --listen-peer-urls "$PEER_SCHEME://127.0.0.1:${EP[$((i + 3))]}" --initial-advertise-peer-urls "$PEER_SCHEME://127.0.0.1:${EP[$((i + 3))]}" \
    --initial-cluster "$CLUSTER" --initial-cluster-state new --initial-cluster-token strata-bench \
    >"$OUT/logs/etcd-$n.log" 2>&1 &
  PIDS+=($!)
done
ETCD_ALL="127.0.0.1:${EP[0]},127.0.0.1:${EP[1]},127.0.0.1:${EP[2]}"
if wait_serving "$ETCD_ALL"; then
  # Writes go to the leader (etcd's best case: no forwarding hop), reads and watches to all members.
  ETCD_LEADER="$(ETCDCTL_API=3 etcdctl ${ETCDCTL_TLS[@]+"${ETCDCTL_TLS[@]}"} --endpoints="$(echo "$ETCD_ALL" | sed "s|[^,]*|$SCHEME://&|g")" endpoint status -w json 2>/dev/null | python3 -c '
import json, sys
for s in json.load(sys.stdin):
    if s["Status"]["header"]["member_id"] == s["Status"]["leader"]:
        print(s["Endpoint"].split("://")[-1]); break')"
  ETCD_LEADER="${ETCD_LEADER:-${ETCD_ALL%%,*}}"
  echo "etcd leader: $ETCD_LEADER" >>"$OUT/run.log"
  suite_writes "$ETCD_LEADER"
  suite_reads "" "$ETCD_ALL"
  suite_watch "" "$ETCD_LEADER,$ETCD_ALL"
else
  echo "etcd did not start: see $OUT/logs" >&2
fi
stop_all

# ---------------------------------------------------------------- Strata
if [ "$ETCD_ONLY" = 0 ]; then
  log "Strata: 3 journal nodes + 1 frontend, then 2 frontends"
  SYSTEM=strata
  read -r -a SP <<<"$(free_ports 7)"
  PEERS="1=127.0.0.1:${SP[0]},2=127.0.0.1:${SP[1]},3=127.0.0.1:${SP[2]}"
  JOURNALS="127.0.0.1:${SP[0]},127.0.0.1:${SP[1]},127.0.0.1:${SP[2]}"
  for i in 0 1 2; do
    n=$((i + 1))
    "$STRATA_BIN" journal --id "$n" --listen "127.0.0.1:${SP[$i]}" --peers "$PEERS" --data-dir "$WORK/journal-$n" ${STRATA_INTERNAL_TLS[@]+"${STRATA_INTERNAL_TLS[@]}"} \
      >"$OUT/logs/journal-$n.log" 2>&1 &
    PIDS+=($!)
  done
  FE1="127.0.0.1:${SP[3]}"; FE2="127.0.0.1:${SP[5]}"
  # One tokio worker for the lone frontend too (STRATA_FE_WORKERS to change it): it shares the
  # two cores with three journal nodes and the load generator, and with two workers it spent
  # ~20 % more CPU per put for no more puts/s (docs/benchmarks/frontend.md, session 6).
  TOKIO_WORKER_THREADS="${STRATA_FE_WORKERS:-1}" STRATA_LOG=warn "$STRATA_BIN" frontend ${SERVER_TLS[@]+"${SERVER_TLS[@]}"} ${STRATA_INTERNAL_TLS[@]+"${STRATA_INTERNAL_TLS[@]}"} --journal "$JOURNALS" --listen "$FE1" --metrics-listen "127.0.0.1:${SP[4]}" \
    >"$OUT/logs/frontend-1.log" 2>&1 &
  PIDS+=($!); FRONTEND_PIDS+=($!)
  if wait_serving "$FE1"; then
    suite_writes "$FE1"
    suite_reads "" "$FE1"
    suite_watch "" "$FE1"
    # Two frontends on two cores (with three journal nodes and the load generator): each runs
    # one tokio worker, as a deployment sizes a frontend to the cores it gets; the first is
    # restarted that way. Two workers each measured 25-50% fewer reads/s and ~35% more
    # frontend CPU per read here (docs/benchmarks/frontend.md, session 4).
    FE1_PID="${FRONTEND_PIDS[0]}"
    kill "$FE1_PID" 2>/dev/null; wait "$FE1_PID" 2>/dev/null
    KEEP=(); for p in "${PIDS[@]}"; do [ "$p" = "$FE1_PID" ] || KEEP+=("$p"); done
    PIDS=("${KEEP[@]}"); FRONTEND_PIDS=()
    TOKIO_WORKER_THREADS=1 STRATA_LOG=warn "$STRATA_BIN" frontend ${SERVER_TLS[@]+"${SERVER_TLS[@]}"} ${STRATA_INTERNAL_TLS[@]+"${STRATA_INTERNAL_TLS[@]}"} --journal "$JOURNALS" --listen "$FE1" --metrics-listen "127.0.0.1:${SP[4]}" \
      >"$OUT/logs/frontend-1b.log" 2>&1 &
    PIDS+=($!); FRONTEND_PIDS+=($!)
    TOKIO_WORKER_THREADS=1 STRATA_LOG=warn "$STRATA_BIN" frontend ${SERVER_TLS[@]+"${SERVER_TLS[@]}"} ${STRATA_INTERNAL_TLS[@]+"${STRATA_INTERNAL_TLS[@]}"} --journal "$JOURNALS" --listen "$FE2" --metrics-listen "127.0.0.1:${SP[6]}" \
      >"$OUT/logs/frontend-2.log" 2>&1 &
    PIDS+=($!); FRONTEND_PIDS+=($!)
    if wait_serving "$FE1" && wait_serving "$FE2"; then
      SYSTEM=strata2
      suite_reads "" "$FE1,$FE2"
      suite_watch "" "$FE1,$FE2"
    else
      echo "the second frontend did not serve within ${READY_TIMEOUT}s: see $OUT/logs" >&2
    fi
  else
    echo "Strata did not serve within ${READY_TIMEOUT}s: see $OUT/logs" >&2
  fi
  stop_all
fi

# ---------------------------------------------------------------- table
machine_state "end"
BENCH_TLS="$TLS" python3 - "$OUT" "$STRATA_BIN" <<'EOF' | tee "$OUT/results.md"
import glob, json, os, sys
out = sys.argv[1]
res = {}
for f in glob.glob(os.path.join(out, "json", "*.json")):
    system, name = os.path.basename(f)[:-5].split("-", 1)
    try:
        with open(f) as fh:
            res[(system, name)] = json.loads(fh.read().strip() or "{}")
    except ValueError:
        res[(system, name)] = {"failed": True}

for f in glob.glob(os.path.join(out, "json", "*.cpu")):
    system, name = os.path.basename(f)[:-4].split("-", 1)
    try:
        fields = open(f).read().split()
        ticks, hz, bench_s = fields[:3]
        r = res.setdefault((system, name), {})
        r["server_cpu_s"] = int(ticks) / int(hz)
        r["bench_cpu_s"] = float(bench_s)
        if len(fields) > 3 and system != "etcd":
            r["frontend_cpu_s"] = int(fields[3]) / int(hz)
    except (ValueError, OSError):
        pass

def per_op_ms(system, name, count_path, what="server_cpu_s"):
    cpu = get(system, name, what)
    n = get(system, name, *count_path)
    return cpu * 1000.0 / n if cpu is not None and n else None

def get(system, name, *path):
    v = res.get((system, name))
    for p in path:
        if not isinstance(v, dict) or p not in v:
            return None
        v = v[p]
    return v

def fmt(v, unit=""):
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, int):
        return f"{v:,}"
    if v >= 100:
        return f"{v:,.0f}{unit}"
    return f"{v:.2f}{unit}" if v >= 1 or v == 0 else f"{v:.3f}{unit}"

def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "n/a"

systems = [("etcd", "etcd 3.4 (3 members)"), ("strata", "Strata, 1 frontend"), ("strata2", "Strata, 2 frontends")]
rows = []
def row(label, name, *path, unit=""):
    rows.append([label] + [fmt(get(s, name, *path), unit) for s, _ in systems])

watchers = next((n.split("-")[1] for (s, n) in res if n.startswith("watch-") and not n.startswith("watch-latency")), "1000")
W = f"watch-{watchers}"
row("put, 256 clients: requests/s", "put-256", "rps")
row("put, 256 clients: p99 ms", "put-256", "latency_ms", "p99")
row("put, 256 clients: errors", "put-256", "errors")
row("txn-cas, 64 clients: requests/s", "txn-cas-64", "rps")
row("txn-cas, 64 clients: conflicts", "txn-cas-64", "conflicts")
row("lock/unlock, 64 clients, own names: cycles/s", "lock-64", "rps")
row("lock/unlock, 64 clients, own names: p99 ms", "lock-64", "latency_ms", "p99")
row("lock/unlock, 16 clients, one name: cycles/s", "lock-1name-16", "rps")
row("campaign/resign, 16 clients, one name: cycles/s", "election-1name-16", "rps")
row("range linearizable, 64 clients: requests/s", "range-l-64", "rps")
row("range linearizable, 64 clients: p99 ms", "range-l-64", "latency_ms", "p99")
row("range serializable, 64 clients: requests/s", "range-s-64", "rps")
row("range serializable, 64 clients: p99 ms", "range-s-64", "latency_ms", "p99")
row(f"watch {watchers} watchers: all delivered once, in order", W, "verify", "ok")
row(f"watch {watchers} watchers: events delivered", W, "verify", "delivered")
row(f"watch {watchers} watchers: delivery p50 ms (from put ack)", W, "delivery_from_ack", "latency_ms", "p50")
row(f"watch {watchers} watchers: delivery p99 ms (from put ack)", W, "delivery_from_ack", "latency_ms", "p99")
row(f"watch {watchers} watchers: delivery p99 ms (from put send)", W, "delivery_from_send", "latency_ms", "p99")
row("watch-latency, 10 watchers: p99 ms (from put ack)", "watch-latency-10", "delivery_from_ack", "latency_ms", "p99")
def cpu_row(label, name, *count_path, what="server_cpu_s"):
    rows.append([label] + [fmt(per_op_ms(s, name, count_path, what)) for s, _ in systems])
cpu_row("server CPU ms per put (256 clients)", "put-256", "ok")
cpu_row("server CPU ms per lock/unlock cycle (own names)", "lock-64", "ok")
cpu_row("server CPU ms per linearizable range", "range-l-64", "ok")
cpu_row("server CPU ms per serializable range", "range-s-64", "ok")
cpu_row(f"server CPU ms per watch event delivered", W, "verify", "delivered")
# Strata's server CPU split: the frontends' part (the rest is the journal nodes').
cpu_row("  of which frontends, per put", "put-256", "ok", what="frontend_cpu_s")
cpu_row("  of which frontends, per linearizable range", "range-l-64", "ok", what="frontend_cpu_s")
cpu_row("  of which frontends, per serializable range", "range-s-64", "ok", what="frontend_cpu_s")
# The load generator shares the cores: its CPU per request bounds both systems alike.
cpu_row("bench client CPU ms per put", "put-256", "ok", what="bench_cpu_s")
cpu_row("bench client CPU ms per linearizable range", "range-l-64", "ok", what="bench_cpu_s")
cpu_row("bench client CPU ms per serializable range", "range-s-64", "ok", what="bench_cpu_s")

widths = [max(len(r[i]) for r in rows + [["workload"] + [l for _, l in systems]]) for i in range(4)]
def line(cells):
    return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
print("# Strata vs etcd 3.4, same machine, same run" + (", client ports over TLS (client certificates required)" if os.environ.get("BENCH_TLS") == "1" else "") + "\n")
print(line(["workload"] + [l for _, l in systems]))
print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
for r in rows:
    print(line(r))

e_put, s_put = get("etcd", "put-256", "rps"), get("strata", "put-256", "rps")
e_rl, s_rl, s2_rl = get("etcd", "range-l-64", "rps"), get("strata", "range-l-64", "rps"), get("strata2", "range-l-64", "rps")
e_w = get("etcd", W, "delivery_from_ack", "latency_ms", "p99")
s_w = get("strata", W, "delivery_from_ack", "latency_ms", "p99")
s2_w = get("strata2", W, "delivery_from_ack", "latency_ms", "p99")
def met(ok):
    return "n/a" if ok is None else ("met" if ok else "NOT met")
print("\n## Ratios against the targets\n")
print(f"- put at 256 clients, Strata / etcd: {ratio(s_put, e_put)} (target >= 2x: {met(None if not (s_put and e_put) else s_put >= 2 * e_put)})")
print(f"- linearizable range at 64 clients, Strata 2 frontends / etcd: {ratio(s2_rl, e_rl)} (target >= 3x: {met(None if not (s2_rl and e_rl) else s2_rl >= 3 * e_rl)}); 1 frontend: {ratio(s_rl, e_rl)}")
for label, sw, sys_ in (("1 frontend", s_w, "strata"), ("2 frontends", s2_w, "strata2")):
    ok = get(sys_, W, "verify", "ok")
    verdict = None if sw is None or e_w is None or ok is None else (ok and sw <= e_w)
    print(f"- watch fan-out to {watchers} watchers, {label}: every event delivered: {fmt(ok)}; p99 {fmt(sw, ' ms')} vs etcd {fmt(e_w, ' ms')} (target no worse: {met(verdict)})")
print(f"\nRaw reports: {out}/json; machine state: {out}/machine.md; binary: {sys.argv[2]}")
EOF
echo "results: $OUT/results.md" >&2
