#!/usr/bin/env bash
# LookupRoute with and without `--consumer-auth` (issue 19), alternated in one
# run against a real etcd + kube-apiserver on loopback: the lookup token is a
# service-account token minted by the apiserver for the consumer audience, and
# the in-process server of `bench grpc` reviews it with TokenReview (the first
# call per token; every later call is a cache hit).
#
#   bench/consumer-auth/run.sh [BINARY]
#
# BINARY defaults to target/release/inferencecache. ROUNDS (default 3) pairs
# of runs; CONC (default 1,16) and DURATION (default 5s) go to `bench grpc`.
# Needs etcd and the kube-apiserver that `.ci/install-real-parts` installs.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$(realpath "${1:-target/release/inferencecache-bench}")
apiserver=${INFERENCECACHE_KUBE_APISERVER:-/var/cache/inferencecache/kube-apiserver}
[ -x "$bin" ] || { echo "$bin missing: cargo build --release -p inferencecache-bench" >&2; exit 2; }
[ -x "$apiserver" ] && command -v etcd >/dev/null \
  || { echo "etcd or $apiserver missing: bash .ci/install-real-parts" >&2; exit 2; }
ROUNDS=${ROUNDS:-3}
CONC=${CONC:-1,16}
DURATION=${DURATION:-5s}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ec=$(port); ep=$(port); ap=$(port)
etcd --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$ec" \
  --advertise-client-urls "http://127.0.0.1:$ec" --listen-peer-urls "http://127.0.0.1:$ep" \
  --initial-advertise-peer-urls "http://127.0.0.1:$ep" --initial-cluster "default=http://127.0.0.1:$ep" \
  >/dev/null 2>&1 &
pids+=($!)
openssl genrsa -out "$work/sa.key" 2048 2>/dev/null
openssl rsa -pubout -in "$work/sa.key" -out "$work/sa.pub" 2>/dev/null
echo 'bench-token,admin,1,"system:masters"' >"$work/tokens.csv"
mkdir -p "$work/certs"
"$apiserver" --etcd-servers="http://127.0.0.1:$ec" --bind-address=127.0.0.1 --secure-port="$ap" \
  --cert-dir="$work/certs" --insecure-port=0 --token-auth-file="$work/tokens.csv" \
  --authorization-mode=RBAC --service-account-issuer=https://kubernetes.default.svc \
  --service-account-key-file="$work/sa.pub" --service-account-signing-key-file="$work/sa.key" \
  --service-cluster-ip-range=10.0.0.0/24 --disable-admission-plugins=ServiceAccount \
  >/dev/null 2>"$work/apiserver.log" &
pids+=($!)
cat >"$work/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: b
  cluster: {server: "https://127.0.0.1:$ap", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: bench-token}
contexts:
- name: b
  context: {cluster: b, user: admin}
current-context: b
EOF
k() { kubectl --kubeconfig "$work/kubeconfig" "$@"; }
for _ in $(seq 120); do k create serviceaccount gw >/dev/null 2>&1 && break; sleep 0.5; done
k create token gw --audience inferencecache.io/consumer >"$work/consumer.token"
echo "machine: $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
for r in $(seq "$ROUNDS"); do
  echo "== round $r: baseline"
  "$bin" --log-level error grpc --concurrency "$CONC" --duration "$DURATION"
  echo "== round $r: --consumer-auth"
  "$bin" --log-level error grpc --concurrency "$CONC" --duration "$DURATION" \
    --consumer-auth --kubeconfig "$work/kubeconfig" --token-file "$work/consumer.token"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
