#!/usr/bin/env bash
# Throughput of Keyway against Redis Cluster on this machine, in one run.
#
# Starts a 3-node Redis Cluster (Debian redis-server) and a 3-node `keyway dev`,
# runs the same redis-benchmark --cluster load on each, and prints ops/s and
# p50 latency for both with the Keyway/Redis ratio.
#
# usage: bench/redis-compare.sh [-n REQUESTS] [-c CLIENTS] [-P PIPELINE] [--fsync always|everysec|no]
#   --fsync picks Redis's appendfsync; Keyway's durability is matched to it
#   (always -> group, everysec -> periodic, no -> none).
set -euo pipefail
cd "$(dirname "$0")/.."
N=100000; C=50; P=1; FSYNC=always
while [ $# -gt 0 ]; do
  case "$1" in
    -n) N=$2; shift 2;; -c) C=$2; shift 2;; -P) P=$2; shift 2;;
    --fsync) FSYNC=$2; shift 2;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
case "$FSYNC" in always) KW_DUR=group;; everysec) KW_DUR=periodic;; no) KW_DUR=none;; *) echo "bad --fsync" >&2; exit 2;; esac
bash scripts/setup.sh
cargo build --release --bin keyway -q
WORK=$(mktemp -d)
RPORT=${RPORT:-17101}; KPORT=${KPORT:-17201}
cleanup() {
  for i in 0 1 2; do redis-cli -p $((RPORT+i)) shutdown nosave >/dev/null 2>&1 || true; done
  [ -n "${KW_PID:-}" ] && kill -INT "$KW_PID" 2>/dev/null && wait "$KW_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

for i in 0 1 2; do
  d="$WORK/redis-$i"; mkdir -p "$d"
  redis-server --port $((RPORT+i)) --cluster-enabled yes --cluster-config-file "$d/nodes.conf" \
    --dir "$d" --appendonly yes --appendfsync "$FSYNC" --save '' --daemonize yes --logfile "$d/log" >/dev/null
done
for i in 0 1 2; do until redis-cli -p $((RPORT+i)) ping >/dev/null 2>&1; do sleep 0.05; done; done
redis-cli --cluster create 127.0.0.1:$RPORT 127.0.0.1:$((RPORT+1)) 127.0.0.1:$((RPORT+2)) --cluster-yes >/dev/null
until redis-cli -p $RPORT cluster info | grep -q 'cluster_state:ok'; do sleep 0.05; done

./target/release/keyway dev --nodes 3 --port $KPORT --admin-port $((KPORT+100)) --meta-port $((KPORT-1)) \
  --data "$WORK/keyway" --durability "$KW_DUR" > "$WORK/keyway.out" 2>&1 &
KW_PID=$!
until grep -q 'Ctrl-C stops' "$WORK/keyway.out" 2>/dev/null; do
  kill -0 $KW_PID 2>/dev/null || { cat "$WORK/keyway.out"; exit 1; }; sleep 0.05
done

run() { # port -> lines "TEST ops/s p50_ms p99_ms"
  redis-benchmark --cluster -p "$1" -t set,get -n "$N" -c "$C" -P "$P" --csv 2>/dev/null \
    | tr -d '\r' | grep -E '^"(SET|GET)"' | tr -d '"' | awk -F, '{ print $1, $2, $5, $7 }'
}
echo "redis-benchmark --cluster -t set,get -n $N -c $C -P $P; Redis appendfsync $FSYNC vs Keyway durability $KW_DUR"
R=$(run $RPORT); K=$(run $KPORT)
printf '%-5s %13s %13s %7s %12s %12s %12s %12s\n' test redis_ops/s keyway_ops/s ratio redis_p50ms keyway_p50ms redis_p99ms keyway_p99ms
for t in SET GET; do
  read -r _ rops rp50 rp99 <<<"$(echo "$R" | grep "^$t ")"
  read -r _ kops kp50 kp99 <<<"$(echo "$K" | grep "^$t ")"
  ratio=$(awk -v a="$kops" -v b="$rops" 'BEGIN { if (b > 0) printf "%.2f", a/b; else print "n/a" }')
  printf '%-5s %13s %13s %7s %12s %12s %12s %12s\n' "$t" "$rops" "$kops" "$ratio" "$rp50" "$kp50" "$rp99" "$kp99"
done
