#!/usr/bin/env bash
# Where a request's CPU goes, Keyway against Redis Cluster, in one run: the
# servers' user and system CPU time per request, and what is left of the
# machine for the load generator.
#
# One after the other, each alone on the machine: a 3-master Redis Cluster
# (appendfsync always) and a 3-node `keyway dev` (durability group,
# replication factor 1). Each is loaded with 200,000 SETs first, then
# measured under `redis-benchmark --cluster -t TEST -n N -c 50 -P P` while
# the servers' CPU (utime, stime of their processes) and the machine's
# (/proc/stat) are read before and after. Prints per system:
#   ops/s, server user us/req, server sys us/req, machine us/req
# where machine us/req is the busy time of all cores per request (server,
# load generator and the rest). With every core busy, what is not the
# servers' is mostly redis-benchmark's own: throughput cannot exceed
# cores / (that + the server's cost), whatever the server does.
#
# usage: bench/cpu-per-request.sh [-t get|set|...] [-P PIPELINE] [-n REQUESTS]
#          [--rf "1 2"]
#   --rf: Keyway's replication factors, one measured run each (default 1).
#   KEYWAY_BIN=path uses that keyway binary instead of building the release one.
#   KEYWAY_DEV_ARGS="..." adds flags to `keyway dev` (an A/B of a setting).
set -euo pipefail
cd "$(dirname "$0")/.."
TEST=get; P=1; N=1000000; RFS=1
while [ $# -gt 0 ]; do
  case "$1" in
    -t) TEST=$2; shift 2;; -P) P=$2; shift 2;; -n) N=$2; shift 2;;
    --rf) RFS=$2; shift 2;;
    *) echo "unknown argument $1" >&2; exit 2;;
  esac
done
[[ "$P" =~ ^[0-9]+$ && "$N" =~ ^[0-9]+$ ]] || { echo "-P and -n take positive integers" >&2; exit 2; }
for rf in $RFS; do
  case "$rf" in 1|2|3) ;; *) echo "--rf takes replication factors 1..3 (3 nodes)" >&2; exit 2;; esac
done
bash scripts/setup.sh
source bench/lib.sh
keyway_binary
WORK=$(mktemp -d)
RPORT=${RPORT:-17101}; KPORT=${KPORT:-17201}
PIDS=()
stop_all() {
  for pid in "${PIDS[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
trap 'stop_all; rm -rf "$WORK"' EXIT
TICK=$(getconf CLK_TCK)

# The servers' CPU ticks so far: "user system".
server_ticks() {
  local u=0 s=0 f
  for pid in "${PIDS[@]}"; do
    read -r -a f < "/proc/$pid/stat"
    # Fields 14 and 15 (utime, stime); the name (field 2) has no spaces here.
    u=$((u + f[13])); s=$((s + f[14]))
  done
  echo "$u $s"
}
# The machine's busy and total ticks: "busy total".
machine_ticks() {
  local _c u n s i w q sq st
  read -r _c u n s i w q sq st _ < /proc/stat
  echo "$((u + n + s + q + sq + st)) $((u + n + s + i + w + q + sq + st))"
}

measure() { # label port
  redis-benchmark --cluster -p "$2" -t set -n 200000 -c 50 -q > /dev/null 2>&1
  local s0 m0 s1 m1 out ops
  s0=$(server_ticks); m0=$(machine_ticks)
  out=$(redis-benchmark --cluster -p "$2" -t "$TEST" -n "$N" -c 50 -P "$P" --csv 2>/dev/null | tr -d '\r"' \
    | grep -E "^${TEST^^}," | cut -d, -f2)
  s1=$(server_ticks); m1=$(machine_ticks)
  ops=${out:-0}
  # redis-benchmark --cluster notices the end on a 250 ms tick: short runs
  # overstate their time (the CPU per request is not affected).
  awk -v n="$N" -v ops="$ops" 'BEGIN { if (ops > 0 && n / ops < 5)
    printf "warning: the run took %.2f s: ops/s rounded down by up to 250 ms, raise -n\n", n / ops > "/dev/stderr" }'
  read -r su ss <<< "$s0"; read -r eu es <<< "$s1"
  read -r mb mt <<< "$m0"; read -r nb nt <<< "$m1"
  awk -v label="$1" -v ops="$ops" -v n="$N" -v tick="$TICK" \
      -v u=$((eu - su)) -v s=$((es - ss)) -v busy=$((nb - mb)) -v total=$((nt - mt)) 'BEGIN {
    us = 1e6 / tick / n
    printf "%-32s %12.0f %12.2f %12.2f %12.2f %9.0f%%\n", label, ops, u * us, s * us, busy * us, 100 * busy / total
  }'
}

printf '%-32s %12s %12s %12s %12s %10s\n' "redis-benchmark -t $TEST -P $P" ops/s user_us/req sys_us/req machine_us busy
redis_cluster_up "$WORK" "$RPORT" 3 0 always PIDS
measure "redis 3 masters (always)" "$RPORT"
stop_all

for rf in $RFS; do
  "$KW" dev --nodes 3 --port "$KPORT" --admin-port $((KPORT+100)) --meta-port $((KPORT-1)) \
    --manager-admin-port $((KPORT+200)) --data "$WORK/keyway-rf$rf" --durability group \
    --replication-factor "$rf" ${KEYWAY_DEV_ARGS:-} > "$WORK/keyway.out" 2>&1 &
  PIDS+=($!)
  until grep -q 'Ctrl-C stops' "$WORK/keyway.out" 2>/dev/null; do
    kill -0 "${PIDS[0]}" 2>/dev/null || { cat "$WORK/keyway.out" >&2; exit 1; }; sleep 0.05
  done
  [ "$rf" = 1 ] && keyway_steady "$WORK/keyway-rf$rf" $((KPORT+100)) 3
  measure "keyway rf=$rf (group)" "$KPORT"
  stop_all
done
echo "us/req: CPU time per request; machine_us: all cores' busy time per request (servers, load generator, the rest); busy: share of the cores busy during the run"
