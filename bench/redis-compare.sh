#!/usr/bin/env bash
# Throughput and latency of Keyway against Redis Cluster on this machine, in one run.
#
# One after the other (never two at once, so each has the cores to itself):
#   - a Redis Cluster of 3 masters (Debian redis-server), with 1 replica each
#     (--redis-replicas 1, the default: 6 processes) or none (0);
#   - a 3-node `keyway dev` per replication factor in --rf (default "1 2").
# On each, the same `redis-benchmark --cluster -t set,get` load: redis-benchmark
# asks the cluster which node serves which slots and gives each node's clients
# keys with a hash tag of that node's slots, so every request is single-slot
# and sent to its primary (no data is preloaded). Prints, per system, SET and
# GET requests/s, p50 and p99, and the ratio of each Keyway row to Redis.
#
# Redis replicates asynchronously: its SET is acknowledged by the master
# before any replica has it (a failover can lose it). Keyway with replication
# factor 2 acknowledges a SET only once it is durable at the primary and at
# every in-sync replica (no acknowledged write lost on failover).
#
# usage: bench/redis-compare.sh [-n REQUESTS] [-c CLIENTS] [-P PIPELINE]
#          [--fsync always|everysec|no] [--rf "1 2"] [--redis-replicas 0|1]
#   --fsync picks Redis's appendfsync; Keyway's durability is matched to it
#   (always -> group, everysec -> periodic, no -> none).
#   KEYWAY_BIN=path uses that keyway binary instead of building the release one.
#   KEYWAY_DEV_ARGS="..." adds flags to every `keyway dev` (an A/B of a setting).
#   -n defaults to 1,000,000 times the pipeline depth: in cluster mode
#   redis-benchmark runs a thread per node and notices the end on its 250 ms
#   throughput tick, so a run's time is rounded up to the next quarter
#   second (100,000 requests at 100,000/s printed 79,872/s or 99,900/s by
#   chance). Runs shorter than 5 s are flagged on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
N=""; C=50; P=1; FSYNC=always; RFS="1 2"; REDIS_REPLICAS=1
while [ $# -gt 0 ]; do
  case "$1" in
    -n) N=$2; shift 2;; -c) C=$2; shift 2;; -P) P=$2; shift 2;;
    --fsync) FSYNC=$2; shift 2;;
    --rf) RFS=$2; shift 2;;
    --redis-replicas) REDIS_REPLICAS=$2; shift 2;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
[ -n "$N" ] || N=$((1000000 * P))
case "$FSYNC" in always) KW_DUR=group;; everysec) KW_DUR=periodic;; no) KW_DUR=none;; *) echo "bad --fsync" >&2; exit 2;; esac
case "$REDIS_REPLICAS" in 0|1) ;; *) echo "--redis-replicas must be 0 or 1" >&2; exit 2;; esac
for rf in $RFS; do
  case "$rf" in 1|2|3) ;; *) echo "--rf takes replication factors 1..3 (3 nodes)" >&2; exit 2;; esac
done
bash scripts/setup.sh
source bench/lib.sh
keyway_binary
WORK=$(mktemp -d)
RPORT=${RPORT:-17101}; KPORT=${KPORT:-17201}
REDIS_PIDS=(); KW_PID=""
stop_redis() {
  for pid in "${REDIS_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${REDIS_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  REDIS_PIDS=()
}
stop_keyway() {
  if [ -n "$KW_PID" ]; then
    kill -INT "$KW_PID" 2>/dev/null || true
    wait "$KW_PID" 2>/dev/null || true
    KW_PID=""
  fi
}
cleanup() { stop_redis; stop_keyway; rm -rf "$WORK"; }
trap cleanup EXIT

bench() { # port -> lines "TEST ops/s p50_ms p99_ms"; flags runs under 5 s on stderr
  redis-benchmark --cluster -p "$1" -t set,get -n "$N" -c "$C" -P "$P" --csv 2>/dev/null \
    | tr -d '\r' | grep -E '^"(SET|GET)"' | tr -d '"' | awk -F, '{ print $1, $2, $5, $7 }' \
    | awk -v n="$N" '{ print } $2 > 0 && n / $2 < 5 {
        printf "warning: %s ran %.2f s: rounded up to a 250 ms tick, raise -n\n", $1, n / $2 > "/dev/stderr" }'
}

# Redis Cluster: 3 masters (+ 3 replicas), stopped by PID.
redis_cluster_up "$WORK" "$RPORT" 3 "$REDIS_REPLICAS" "$FSYNC" REDIS_PIDS
echo "redis-benchmark --cluster -t set,get -n $N -c $C -P $P; Redis appendfsync $FSYNC vs Keyway durability $KW_DUR" >&2
ROWS=()
LABELS=()
R=$(bench $RPORT)
if [ "$REDIS_REPLICAS" -gt 0 ]; then
  LABELS+=("redis 3 masters+3 replicas (async)")
else
  LABELS+=("redis 3 masters, no replicas")
fi
ROWS+=("$R")
stop_redis

kw_has_rf=""
"$KW" dev --help 2>/dev/null | grep -q -- '--replication-factor' && kw_has_rf=1
for rf in $RFS; do
  flags=()
  if [ -n "$kw_has_rf" ]; then
    flags=(--replication-factor "$rf")
  elif [ "$rf" != 1 ]; then
    echo "this keyway binary has no --replication-factor: cannot run rf=$rf" >&2; exit 1
  fi
  d="$WORK/keyway-rf$rf"
  "$KW" dev --nodes 3 --port $KPORT --admin-port $((KPORT+100)) --meta-port $((KPORT-1)) \
    --manager-admin-port $((KPORT+200)) --data "$d" --durability "$KW_DUR" "${flags[@]}" ${KEYWAY_DEV_ARGS:-} \
    > "$WORK/keyway-rf$rf.out" 2>&1 &
  KW_PID=$!
  until grep -q 'Ctrl-C stops' "$WORK/keyway-rf$rf.out" 2>/dev/null; do
    kill -0 $KW_PID 2>/dev/null || { cat "$WORK/keyway-rf$rf.out"; exit 1; }; sleep 0.05
  done
  [ "$rf" = 1 ] && keyway_steady "$d" $((KPORT+100)) 3
  K=$(bench $KPORT)
  [ -n "$K" ] || { echo "redis-benchmark printed nothing for keyway rf=$rf" >&2; cat "$WORK/keyway-rf$rf.out" >&2; exit 1; }
  if [ "$rf" -gt 1 ]; then LABELS+=("keyway rf=$rf (sync)"); else LABELS+=("keyway rf=1"); fi
  ROWS+=("$K")
  stop_keyway
done

field() { # rows test column(2=ops 3=p50 4=p99)
  echo "$1" | awk -v t="$2" -v c="$3" '$1 == t { print $c }'
}
printf '%-35s %11s %8s %8s %7s %11s %8s %8s %7s\n' system SET_ops/s p50_ms p99_ms ratio GET_ops/s p50_ms p99_ms ratio
for i in "${!ROWS[@]}"; do
  line=$(printf '%-35s' "${LABELS[$i]}")
  for t in SET GET; do
    ops=$(field "${ROWS[$i]}" $t 2); p50=$(field "${ROWS[$i]}" $t 3); p99=$(field "${ROWS[$i]}" $t 4)
    rops=$(field "${ROWS[0]}" $t 2)
    ratio=$(awk -v a="$ops" -v b="$rops" 'BEGIN { if (b > 0) printf "%.2f", a/b; else print "n/a" }')
    line+=$(printf ' %11s %8s %8s %7s' "${ops:-n/a}" "${p50:-n/a}" "${p99:-n/a}" "$ratio")
  done
  echo "$line"
done
# Each replication factor against factor 1, from this run.
rf1=""
for i in "${!ROWS[@]}"; do [ "${LABELS[$i]}" = "keyway rf=1" ] && rf1=$i; done
if [ -n "$rf1" ]; then
  for i in "${!ROWS[@]}"; do
    case "${LABELS[$i]}" in keyway\ rf=1|redis*) continue;; esac
    line=$(printf '%-35s' "${LABELS[$i]} / rf=1")
    for t in SET GET; do
      line+=$(awk -v a="$(field "${ROWS[$i]}" $t 2)" -v b="$(field "${ROWS[$rf1]}" $t 2)" -v t=$t \
        'BEGIN { if (b > 0) printf " %s %.2f", t, a/b; else printf " %s n/a", t }')
    done
    echo "$line"
  done
fi
echo "ratio: requests/s against the Redis row. Redis replicates asynchronously (a SET is acknowledged before its replica has it); Keyway rf=2 acknowledges only once the write is durable at the primary and its in-sync replica."
