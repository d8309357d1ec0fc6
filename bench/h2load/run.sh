#!/usr/bin/env bash
# LookupRoute over the wire, measured by an independent C load generator
# (h2load, Debian's nghttp2-client) against the gRPC health Check on the same
# server in the same run (the framework's floor). The server runs on core 0,
# h2load on core 1.
#
#   bench/h2load/run.sh [BINARY] [-- extra serve flags]
#
# BINARY defaults to target/release/inferencecache. REPLICAS=N (4) seeds N
# replicas holding nested prefixes of the chain. Prints requests/s and
# latency for both RPCs and the LookupRoute/Check ratio. INGEST=N (blocks/s)
# runs `bench grpc --server` beside h2load on core 1, re-reporting chains at
# that rate (plus one closed-loop lookup client) for the whole measurement.
# Each row also gives the server's CPU per call (utime + stime from
# /proc/PID/stat around the measured calls), which holds on a loaded machine
# where requests/s do not (the server gets a varying share of its core).
# PERF=FILE records the server's profile during the measured LookupRoute run
# (`perf record -F 999 --call-graph dwarf`; read it with `perf report -i FILE`),
# and the Check's into FILE.check (the floor the lookup is compared with).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-target/release/inferencecache}
shift || true
[ "${1:-}" = "--" ] && shift
command -v h2load >/dev/null || { echo "h2load missing: apt-get install -y --no-install-recommends nghttp2-client" >&2; exit 2; }
[ -x "$bin" ] || { echo "$bin missing: cargo build --release -p inferencecache-cli" >&2; exit 2; }
# The ingest client is a benchmark rig, not part of the shipped binary.
bench=${BENCH_BIN:-target/release/inferencecache-bench}
[ -x "$bench" ] || { echo "$bench missing: cargo build --release -p inferencecache-bench" >&2; exit 2; }
N=${N:-400000}
C=${C:-4}
M=${M:-16}
work=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
python3 bench/h2load/frames.py "$work" --blocks "${BLOCKS:-32}" --replicas "${REPLICAS:-4}"
taskset -c 0 "$bin" --log-level error serve --grpc-bind-address "127.0.0.1:$port" \
  --http-bind-address 127.0.0.1:0 --snapshot-bind-address 127.0.0.1:0 "$@" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
url="http://127.0.0.1:$port"
hdr=(-H 'content-type: application/grpc' -H 'te: trailers')
for _ in $(seq 50); do
  h2load -n 1 -c 1 "${hdr[@]}" -d "$work/health.bin" "$url/grpc.health.v1.Health/Check" >/dev/null 2>&1 && break
  sleep 0.2
done
for f in "$work"/report-*.bin; do
  h2load -n 1 -c 1 "${hdr[@]}" -d "$f" \
    "$url/inferencecache.v1alpha1.InferenceCache/ReportCacheState" >/dev/null
done
# The lookup must be a real hint (h2load counts any HTTP 200 as success).
if [ -x .venv/bin/grpcurl ]; then
  .venv/bin/grpcurl -plaintext -d "{\"modelId\":\"m\",\"tenantId\":\"t\",\"hashScheme\":\"vllm\",\"blockHashes\":[$(python3 -c '
import base64,struct,sys
n=int(sys.argv[1]); print(",".join("\""+base64.b64encode(struct.pack(">Q",0xB10C0000+i)).decode()+"\"" for i in range(n)))' "${BLOCKS:-32}")],\"blockTokenCounts\":[$(python3 -c 'import sys; print(",".join(["16"]*int(sys.argv[1])))' "${BLOCKS:-32}")]}" \
    "127.0.0.1:$port" inferencecache.v1alpha1.InferenceCache/LookupRoute | grep -q PREFIX_MATCH \
    || { echo "the seeded lookup is not a PREFIX_MATCH" >&2; exit 1; }
fi
if [ -n "${INGEST:-}" ]; then
  taskset -c 1 "$bench" --log-level error grpc --server "127.0.0.1:$port" --concurrency 1 \
    --duration 3600s --warmup 1s --ingest-rate "$INGEST" >"$work/ingest.out" 2>&1 &
  ingest=$!
  trap 'kill $ingest $pid 2>/dev/null; wait $ingest $pid 2>/dev/null; rm -rf "$work"' EXIT
  sleep 3
  kill -0 "$ingest" 2>/dev/null || { echo "the ingest client did not start:" >&2; cat "$work/ingest.out" >&2; exit 1; }
fi
# The server's CPU time so far, in clock ticks (utime + stime), and its
# write syscalls (responses leave coalesced: a fraction of one per call).
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
writes() { awk '/^syscw/ {print $2}' "/proc/$pid/io"; }
hz=$(getconf CLK_TCK)
run() {
  local name=$1 path=$2 body=$3
  # Warm-up, then the measured run.
  taskset -c 1 h2load -n $((N / 10)) -c "$C" -m "$M" "${hdr[@]}" -d "$body" "$url$path" >/dev/null
  local perf=
  if [ -n "${PERF:-}" ]; then
    local out=$PERF
    [ "$name" = Check ] && out=$PERF.check
    perf record -q -F 999 --call-graph dwarf -o "$out" -p "$pid" 2>/dev/null &
    perf=$!
    sleep 1
  fi
  local t0 w0; t0=$(ticks); w0=$(writes)
  taskset -c 1 h2load -n "$N" -c "$C" -m "$M" "${hdr[@]}" -d "$body" "$url$path" >"$work/h2load.out"
  local t1 w1; t1=$(ticks); w1=$(writes)
  [ -n "$perf" ] && { kill -INT "$perf"; wait "$perf" || true; }
  awk -v n="$name" -v cpu="$(( (t1 - t0) * 1000000 / hz ))" -v calls="$N" -v w="$((w1 - w0))" \
    '/^finished in/ {rps=$4} /^requests:/ {ok=$8} /^time for request:/ {mean=$6; sd=$8} END {printf "%-12s %10s req/s  ok %s  mean %s sd %s  writes %.2f/call  server CPU %.1f us/call\n", n, rps, ok, mean, sd, w / calls, cpu / calls}' \
    "$work/h2load.out" | tee -a "$work/out"
}
run Check /grpc.health.v1.Health/Check "$work/health.bin"
run LookupRoute /inferencecache.v1alpha1.InferenceCache/LookupRoute "$work/lookup.bin"
if [ -n "${INGEST:-}" ]; then
  kill -0 "$ingest" 2>/dev/null || { echo "the ingest client stopped early:" >&2; cat "$work/ingest.out" >&2; exit 1; }
  echo "ingest: $INGEST blocks/s alongside, for both runs"
fi
awk '{gsub(",","",$2); r[NR]=$2; c[NR]=$(NF-1)} END {printf "LookupRoute / Check = %.2f (req/s), %.2f (server CPU per call)\n", r[2]/r[1], c[1]/c[2]}' "$work/out"
